#!/usr/bin/env bash
# clang-format (the repo's .clang-format) and clang-tidy (.clang-tidy) over the
# project's C++ sources. Fails on any finding.
set -euo pipefail
BUILD="${1:-build}"
mapfile -t files < <(git ls-files '*.cc' '*.h' | grep -v '^tests/consumer/')
echo "lint: clang-format on ${#files[@]} files"
clang-format --dry-run -Werror "${files[@]}"
# clang-tidy on the library, tools, benchmarks and examples.
mapfile -t tidy < <(git ls-files 'src/*.cc' 'tools/*.cc' 'benchmarks/*.cc' 'examples/*.cc')
echo "lint: clang-tidy on ${#tidy[@]} files"
printf '%s\n' "${tidy[@]}" | xargs -P 2 -n 4 clang-tidy -p "$BUILD" --quiet 2>&1 | \
  grep -v "warnings generated" | tee "$BUILD/clang-tidy.log" || true
if grep -qE "(warning|error):" "$BUILD/clang-tidy.log"; then
  echo "lint: clang-tidy found problems (see above)"
  exit 1
fi
echo "lint: clean"
