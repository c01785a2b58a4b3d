#!/usr/bin/env bash
# Builds and runs every CUDA / NCCL check on a GPU host, in one call:
#   (here)       bash scripts/gpu_bundle.sh
#   (device)     bash tests/gpu/run.sh          with .gpu-deps carried
# The GPU host has CMake, nvcc, NCCL and PyTorch 2.x but no Debian packages;
# .gpu-deps/ brings abseil, nlohmann-json, xxhash and GoogleTest.
# Checks:
#   1. the NCCL path builds against the host's CUDA/NCCL, and `omni info`
#      finds NCCL and at least one CUDA device (ProbeNccl succeeds);
#   2. the NCCL communicator (tests/unit/comm_nccl_test.cc, CommNccl*): on
#      one GPU init, all-reduce / broadcast / all-gather / barrier, Abort,
#      re-init after abort, init timeout with a peer that never comes; with
#      2+ GPUs also one process per GPU, Abort unblocking a pending
#      all-reduce, and Shrink (or Unimplemented before NCCL 2.27);
#   3. omni_torch_tests built against the host's PyTorch 2.x LibTorch, with
#      every CUDA device's RNG generator saved and restored;
#   4. omni_train --device cuda: deterministic (two runs, one params_xxh3),
#      and tests/integration/test_preemption.py on CUDA (bit-exact resumes).
# Prints "N passed, M failed" last; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEPS="$PWD/.gpu-deps"
OUT="${OUT:-$PWD/build-gpu/out}"
mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/devices.txt" || true
CUDA_ROOT="${CUDA_HOME:-/usr/local/cuda}"
# NCCL: the toolkit's, else the pip wheel's (nvidia-nccl-cu*), wherever the
# wheel puts include/nccl.h.
if [ -z "${NCCL_HOME:-}" ] && [ ! -f "$CUDA_ROOT/include/nccl.h" ]; then
  for d in $(python3 -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null); do
    h="$(find "$d" -name nccl.h -path '*include*' 2>/dev/null | head -n 1)"
    if [ -n "$h" ]; then NCCL_HOME="$(dirname "$(dirname "$h")")"; break; fi
  done
fi
export NCCL_HOME="${NCCL_HOME:-}"
echo "CUDA_ROOT=$CUDA_ROOT NCCL_HOME=$NCCL_HOME" | tee "$OUT/env.txt"
{ c++ --version | head -n 1; cmake --version | head -n 1; nvcc --version | tail -n 1;
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'; } >> "$OUT/env.txt" 2>&1 || true
GEN=""
command -v ninja >/dev/null && GEN="-G Ninja"
cmake -S . -B build-gpu $GEN -DCMAKE_BUILD_TYPE=Release -DCMAKE_DISABLE_FIND_PACKAGE_Gloo=ON -DOMNI_BUILD_TORCH=OFF -DOMNI_BUILD_PYTHON=OFF \
  -DOMNI_BUILD_TESTS=ON -DOMNI_BUILD_BENCHMARKS=OFF -DOMNI_WERROR=OFF -DCUDAToolkit_ROOT="$CUDA_ROOT" \
  -DCMAKE_PREFIX_PATH="$DEPS" -DCMAKE_INCLUDE_PATH="$DEPS/include" -DCMAKE_LIBRARY_PATH="$DEPS/lib" \
  -DGTest_DIR="$DEPS/lib/x86_64-linux-gnu/cmake/GTest" -Dabsl_DIR="$DEPS/lib/x86_64-linux-gnu/cmake/absl" \
  2>&1 | tee "$OUT/configure.log"
grep -q "OMNI_HAVE_NCCL=1" "$OUT/configure.log" || { echo "FAIL: NCCL not found"; exit 1; }
cmake --build build-gpu -j "$(nproc)" --target omni omni_core_tests > "$OUT/build.log" 2>&1 ||
  { tail -n 40 "$OUT/build.log"; echo "FAIL: the core did not build"; exit 1; }
echo "core build: $(grep -c 'warning:' "$OUT/build.log" || true) warning(s) with this compiler"
export LD_LIBRARY_PATH="$DEPS/lib:$DEPS/lib/x86_64-linux-gnu:${NCCL_HOME:+$NCCL_HOME/lib:}${LD_LIBRARY_PATH:-}"

passed=0
failed=0
./build-gpu/bin/omni info | tee "$OUT/info.txt"
if grep -q "CUDA device(s)" "$OUT/info.txt"; then
  passed=$((passed + 1))
else
  echo "FAIL: omni info found no CUDA device"
  failed=$((failed + 1))
fi

# The communicator checks fork one process per GPU; this process must not
# touch CUDA first, so they run on their own (and bounded: a hang is a failure).
set +e
timeout 420 ./build-gpu/bin/omni_core_tests --gtest_filter='CommNccl*' \
  --gtest_output="xml:$OUT/comm_nccl.xml" 2>&1 | tee "$OUT/comm_nccl.log"
rc=${PIPESTATUS[0]}
set -e
n_ok=$(grep -c '^\[       OK \]' "$OUT/comm_nccl.log" || true)
n_fail=$(grep -c '^\[  FAILED  \] .*(' "$OUT/comm_nccl.log" || true)
n_skip=$(grep -c '^\[  SKIPPED \] .*(' "$OUT/comm_nccl.log" || true)
echo "comm_nccl: ${n_ok} ok, ${n_fail} failed, ${n_skip} skipped (exit ${rc})"
passed=$((passed + n_ok))
failed=$((failed + n_fail))
if [ "$rc" -ne 0 ] && [ "$n_fail" -eq 0 ]; then
  echo "FAIL: omni_core_tests exited ${rc} (timeout or crash)"
  failed=$((failed + 1))
fi

# 3. The LibTorch adapters against the host's PyTorch 2.x: every CUDA
#    device's generator saved and restored (TorchState.*Cuda*), and the rest
#    of omni_torch_tests on LibTorch 2.x. Needs a CXX11-ABI LibTorch (as the
#    bundled abseil is); an older ABI is reported and counted as a failure.
TORCH_PREFIX="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)"
TORCH_ABI="$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null || true)"
if [ -z "$TORCH_PREFIX" ]; then
  echo "FAIL: no PyTorch on this host"
  failed=$((failed + 1))
elif [ "$TORCH_ABI" != "1" ]; then
  echo "FAIL: PyTorch uses the pre-CXX11 ABI; omni::torch needs a CXX11-ABI LibTorch here"
  failed=$((failed + 1))
else
  set +e
  cmake -S . -B build-gpu-torch $GEN -DCMAKE_BUILD_TYPE=Release -DCMAKE_DISABLE_FIND_PACKAGE_Gloo=ON -DOMNI_BUILD_TORCH=ON \
    -DOMNI_BUILD_PYTHON=OFF -DOMNI_BUILD_TESTS=ON -DOMNI_BUILD_BENCHMARKS=OFF -DOMNI_WERROR=OFF \
    -DCUDAToolkit_ROOT="$CUDA_ROOT" -DCMAKE_PREFIX_PATH="$DEPS;$TORCH_PREFIX" \
    -DCMAKE_INCLUDE_PATH="$DEPS/include" -DCMAKE_LIBRARY_PATH="$DEPS/lib" \
    -DGTest_DIR="$DEPS/lib/x86_64-linux-gnu/cmake/GTest" -Dabsl_DIR="$DEPS/lib/x86_64-linux-gnu/cmake/absl" > "$OUT/configure_torch.log" 2>&1 &&
    cmake --build build-gpu-torch -j "$(nproc)" --target omni_torch_tests omni_train omni > "$OUT/build_torch.log" 2>&1
  rc=$?
  if [ "$rc" -ne 0 ]; then
    tail -n 30 "$OUT/configure_torch.log" "$OUT/build_torch.log"
    echo "FAIL: omni_torch_tests did not build against PyTorch (exit ${rc})"
    failed=$((failed + 1))
  else
    timeout 300 ./build-gpu-torch/bin/omni_torch_tests 2>&1 | tee "$OUT/torch.log"
    rc=${PIPESTATUS[0]}
    n_ok=$(grep -c '^\[       OK \]' "$OUT/torch.log" || true)
    n_fail=$(grep -c '^\[  FAILED  \] .*(' "$OUT/torch.log" || true)
    grep -q '^\[       OK \] TorchState.RngStateRestoresEveryCudaGenerator' "$OUT/torch.log" ||
      { echo "FAIL: the CUDA generator check did not pass"; n_fail=$((n_fail + 1)); }
    echo "torch: ${n_ok} ok, ${n_fail} failed (exit ${rc})"
    passed=$((passed + n_ok))
    failed=$((failed + n_fail))

    # 4. Training on the GPU: two runs of omni_train --device cuda (with
    #    dropout, which draws from the CUDA generator) give one params_xxh3,
    #    and the preemption tests (SIGTERM at several steps, SIGKILL at random
    #    moments, notices, a corrupt checkpoint) hold on CUDA: every resumed
    #    run equals the uninterrupted one bit for bit.
    T=./build-gpu-torch/bin/omni_train
    a=$("$T" --device cuda --dropout 0.1 --steps 60 --eval-every 20 --quiet 2>&1 | tail -n 1)
    b=$("$T" --device cuda --dropout 0.1 --steps 60 --eval-every 20 --quiet 2>&1 | tail -n 1)
    c=$("$T" --device cpu --dropout 0.1 --steps 60 --eval-every 20 --quiet 2>&1 | tail -n 1)
    echo "cuda run 1: $a"; echo "cuda run 2: $b"; echo "cpu run:    $c"
    if [[ "$a" == final* && "$a" == "$b" ]]; then
      passed=$((passed + 1))
    else
      echo "FAIL: two CUDA runs of omni_train differ (or failed)"
      failed=$((failed + 1))
    fi
    OMNI_BIN_DIR="$PWD/build-gpu-torch/bin" OMNI_TRAIN_EXTRA="--device cuda" PYTHONUNBUFFERED=1 \
      timeout 400 python3 -m pytest -q -p no:cacheprovider -rs \
      --junitxml="$OUT/preemption_cuda.xml" tests/integration/test_preemption.py 2>&1 |
      tee "$OUT/preemption_cuda.log"
    rc=${PIPESTATUS[0]}
    n_all=$(grep -o '<testcase ' "$OUT/preemption_cuda.xml" 2>/dev/null | wc -l || true)
    n_bad=$(grep -Eo '<(failure|error)' "$OUT/preemption_cuda.xml" 2>/dev/null | wc -l || true)
    n_skip=$(grep -o '<skipped' "$OUT/preemption_cuda.xml" 2>/dev/null | wc -l || true)
    n_ok=$((n_all - n_bad - n_skip))
    echo "preemption on cuda: ${n_ok} ok, ${n_bad} failed, ${n_skip} skipped (exit ${rc})"
    if [ "$rc" -eq 0 ]; then
      passed=$((passed + n_ok))
    else
      failed=$((failed + (n_bad > 0 ? n_bad : 1)))
    fi
  fi
  set -e
fi

echo "${passed} passed, ${failed} failed"
[ "$failed" -eq 0 ]
