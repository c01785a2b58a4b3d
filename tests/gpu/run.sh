#!/usr/bin/env bash
# Builds and runs every CUDA / NCCL check on a GPU host, in one call:
#   (here)       bash scripts/gpu_bundle.sh
#   (device)     bash tests/gpu/run.sh          with .gpu-deps carried
# The GPU host has CMake, nvcc, NCCL and PyTorch 2.x but no Debian packages;
# .gpu-deps/ brings abseil, nlohmann-json and xxhash.
# Checks now: the NCCL path builds against the host's CUDA/NCCL, and
# `omni info` finds NCCL and at least one CUDA device (ProbeNccl succeeds).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEPS="$PWD/.gpu-deps"
OUT="${OUT:-$PWD/build-gpu/out}"
mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/devices.txt" || true
CUDA_ROOT="${CUDA_HOME:-/usr/local/cuda}"
NCCL_HOME="${NCCL_HOME:-$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || echo "")}"
export NCCL_HOME
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DOMNI_BUILD_TORCH=OFF -DOMNI_BUILD_PYTHON=OFF \
  -DOMNI_BUILD_TESTS=OFF -DOMNI_BUILD_BENCHMARKS=OFF -DCUDAToolkit_ROOT="$CUDA_ROOT" \
  -DCMAKE_PREFIX_PATH="$DEPS" -DCMAKE_INCLUDE_PATH="$DEPS/include" -DCMAKE_LIBRARY_PATH="$DEPS/lib" \
  2>&1 | tee "$OUT/configure.log"
grep -q "OMNI_HAVE_NCCL=1" "$OUT/configure.log" || { echo "FAIL: NCCL not found"; exit 1; }
cmake --build build-gpu -j "$(nproc)" 2>&1 | tail -n 20 | tee "$OUT/build.log"
export LD_LIBRARY_PATH="$DEPS/lib:${LD_LIBRARY_PATH:-}"
./build-gpu/bin/omni info | tee "$OUT/info.txt"
if grep -q "CUDA device(s)" "$OUT/info.txt"; then
  echo "1 passed, 0 failed"
else
  echo "0 passed, 1 failed"
  exit 1
fi
