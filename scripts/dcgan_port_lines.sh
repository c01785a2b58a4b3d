#!/usr/bin/env bash
# Counts the lines the omni::Runtime port of PyTorch's DCGAN example changed:
# the lines `diff` reports as removed from examples/dcgan/dcgan_original.cpp
# (upstream, unchanged) plus those it reports as added in
# examples/dcgan/dcgan.cpp (a modified line counts twice). Prints
# "dcgan_port_changed_lines N" and fails when N exceeds the limit (30).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LIMIT="${1:-30}"
n=$(diff "$ROOT/examples/dcgan/dcgan_original.cpp" "$ROOT/examples/dcgan/dcgan.cpp" |
  grep -c '^[<>]' || true)
echo "dcgan_port_changed_lines $n"
if [ "$n" -gt "$LIMIT" ]; then
  echo "the port changed $n lines, more than $LIMIT" >&2
  exit 1
fi
