#!/usr/bin/env bash
# make bench: runs every benchmark; each prints one JSON object as its last
# line. The figures are collected into $BUILD/bench/results.jsonl.
set -euo pipefail
BUILD="${1:-build}"
mkdir -p "$BUILD/bench"
out="$BUILD/bench/results.jsonl"
: > "$out"
status=0
for b in "$BUILD"/bin/bench_*; do
  [ -x "$b" ] || continue
  echo "== $(basename "$b") =="
  if "$b" | tee "$BUILD/bench/$(basename "$b").log"; then
    tail -n 1 "$BUILD/bench/$(basename "$b").log" >> "$out"
  else
    echo "$(basename "$b") failed" >&2
    status=1
  fi
done
for py in benchmarks/*.py; do
  [ -f "$py" ] || continue
  [ -x "$BUILD/bin/omni_train" ] || continue
  name=$(basename "$py" .py)
  echo "== $name =="
  if /usr/bin/python3 "$py" "$BUILD" | tee "$BUILD/bench/$name.log"; then
    tail -n 1 "$BUILD/bench/$name.log" >> "$out"
  else
    echo "$name failed" >&2
    status=1
  fi
done
echo
echo "== figures ($out) =="
cat "$out"
exit $status
