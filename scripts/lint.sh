#!/usr/bin/env bash
# clang-format (the repo's .clang-format) and clang-tidy (.clang-tidy) over the
# project's C++ sources. Fails on any finding.
set -euo pipefail
BUILD="${1:-build}"
mapfile -t files < <(git ls-files '*.cc' '*.h' | grep -v '^tests/consumer/')
echo "lint: clang-format on ${#files[@]} files"
clang-format --dry-run -Werror "${files[@]}"
# clang-tidy on the library, tools, benchmarks and examples; clean results are
# cached by scripts/tidy.py (keyed on the preprocessed source).
mapfile -t tidy < <(git ls-files 'src/*.cc' 'tools/*.cc' 'benchmarks/*.cc' 'examples/*.cc')
echo "lint: clang-tidy on ${#tidy[@]} files"
/usr/bin/python3 scripts/tidy.py "$BUILD" "${tidy[@]}" 2>&1 | tee "$BUILD/clang-tidy.log"
if [ "${PIPESTATUS[0]}" -ne 0 ]; then
  echo "lint: clang-tidy found problems (see above)"
  exit 1
fi
echo "lint: clean"
