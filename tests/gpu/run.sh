#!/usr/bin/env bash
# Builds and runs every CUDA / NCCL check on a GPU host, in one call:
#   (here)       bash scripts/gpu_bundle.sh
#   (device)     bash tests/gpu/run.sh          with .gpu-deps carried
# The GPU host has CMake, nvcc, NCCL and PyTorch 2.x but no Debian packages;
# .gpu-deps/ brings abseil, nlohmann-json, xxhash, libsodium and GoogleTest. Both builds
# are without Gloo: NCCL carries the collectives, the store the membership.
# Checks, in order of value (the later ones are skipped when time runs out):
#   1. the NCCL path builds against the host's CUDA/NCCL, and `omni info`
#      finds NCCL and at least one CUDA device (ProbeNccl succeeds);
#   2. the NCCL communicator (tests/unit/comm_nccl_test.cc, CommNccl*): on
#      one GPU init, the collectives on device and on host memory (staged
#      through the device), Abort, re-init after abort, init timeout with a
#      peer that never comes; with 2+ GPUs also one process per GPU, Abort
#      unblocking a pending all-reduce, Shrink (or Unimplemented before NCCL
#      2.27), device memory of another device refused;
#   3. the elastic group over NCCL (tests/unit/elastic_backend_test.cc,
#      ElasticBackend.*/nccl): one replica with gradients on the GPU through a
#      forced failure (its communicator aborted), Recover into a new
#      generation (NCCL aborted and initialised again), the state broadcast
#      over NCCL, then a restart under its id that rejoins the job; with 2+
#      GPUs two replicas, state sync to the laggard, the survivor of a loss;
#   4. omni_train --device cuda built against the host's PyTorch 2.x:
#      deterministic (two runs, one params_xxh3);
#   5. elastic CUDA training through omni::Runtime (omni_train --device cuda
#      --store file://...): SIGTERM, exit 75, restart rejoins the job and
#      resumes, and ends with the params_xxh3 of a straight run;
#   6. omni_torch_tests, with every CUDA device's RNG generator saved and
#      restored;
#   7. tests/integration/test_preemption.py on CUDA (bit-exact resumes).
# Every check prints "PASS: <check>" or "FAIL: <check>: why"; the last line
# is "N passed, M failed"; the exit status is non-zero on any failure. The
# whole run stays within OMNI_GPU_BUDGET_S (default 540 s): every command is
# bounded by `timeout` and by the time left.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEPS="$PWD/.gpu-deps"
OUT="${OUT:-$PWD/build-gpu/out}"
BUDGET_S="${OMNI_GPU_BUDGET_S:-540}"
# Every log goes to LOG; on exit they come back as one archive in OUT (the
# device tool returns at most 8 files), the elastic run's checkpoints and
# stores left out.
LOG="$PWD/build-gpu-logs"
rm -rf "$LOG"
mkdir -p "$OUT" "$LOG"
pack_logs() {
  tar -czf "$OUT/gpu-logs.tar.gz" -C "$LOG" --exclude=ckpt --exclude='*store' . || true
}
trap pack_logs EXIT

passed=0
failed=0
pass() {
  echo "PASS: $1"
  passed=$((passed + 1))
}
fail() {
  echo "FAIL: $1"
  failed=$((failed + 1))
}
# Seconds left of the budget.
left() { echo $((BUDGET_S - SECONDS)); }
# bounded LIMIT CMD...: runs CMD under `timeout` with LIMIT seconds, or less
# when less is left (keeping 15 s for the summary); 124 when it ran out.
bounded() {
  local limit=$1
  shift
  local room=$(($(left) - 15))
  if [ "$room" -lt 5 ]; then
    echo "no time left for: $*"
    return 124
  fi
  if [ "$room" -lt "$limit" ]; then limit=$room; fi
  timeout -k 5 "$limit" "$@"
}
# Counts a gtest log's results (one PASS/FAIL line per test).
count_gtest() {
  local log=$1 rc=$2 name=$3
  local n_ok n_fail n_skip
  n_ok=$(grep -c '^\[       OK \]' "$log" || true)
  n_fail=$(grep -c '^\[  FAILED  \] .*(' "$log" || true)
  n_skip=$(grep -c '^\[  SKIPPED \] .*(' "$log" || true)
  grep -E '^\[  (FAILED  |SKIPPED )\] .*\(' "$log" | sed 's/^/  /' || true
  echo "${name}: ${n_ok} ok, ${n_fail} failed, ${n_skip} skipped (exit ${rc})"
  passed=$((passed + n_ok))
  failed=$((failed + n_fail))
  if [ "$rc" -ne 0 ] && [ "$n_fail" -eq 0 ]; then
    fail "${name}: exited ${rc} (timeout or crash)"
  fi
}

nvidia-smi -L | tee "$LOG/devices.txt" || true
CUDA_ROOT="${CUDA_HOME:-/usr/local/cuda}"
# NCCL: the toolkit's, else the pip wheel's (nvidia-nccl-cu*), wherever the
# wheel puts include/nccl.h.
if [ -z "${NCCL_HOME:-}" ] && [ ! -f "$CUDA_ROOT/include/nccl.h" ]; then
  for d in $(python3 -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null); do
    h="$(find "$d" -name nccl.h -path '*include*' 2>/dev/null | head -n 1)"
    if [ -n "$h" ]; then
      NCCL_HOME="$(dirname "$(dirname "$h")")"
      break
    fi
  done
fi
export NCCL_HOME="${NCCL_HOME:-}"
echo "CUDA_ROOT=$CUDA_ROOT NCCL_HOME=$NCCL_HOME" | tee "$LOG/env.txt"
{
  c++ --version | head -n 1
  cmake --version | head -n 1
  nvcc --version | tail -n 1
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
} >>"$LOG/env.txt" 2>&1 || true
# The bundle's pkg-config files (libsodium).
export PKG_CONFIG_PATH="$DEPS/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
GEN=()
if command -v ninja >/dev/null; then GEN=(-G Ninja); fi
COMMON=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_DISABLE_FIND_PACKAGE_Gloo=ON -DOMNI_BUILD_PYTHON=OFF
  -DOMNI_BUILD_TESTS=ON -DOMNI_BUILD_BENCHMARKS=OFF -DOMNI_WERROR=OFF
  -DCUDAToolkit_ROOT="$CUDA_ROOT" -DCMAKE_INCLUDE_PATH="$DEPS/include"
  -DCMAKE_LIBRARY_PATH="$DEPS/lib" -DGTest_DIR="$DEPS/lib/x86_64-linux-gnu/cmake/GTest"
  -Dabsl_DIR="$DEPS/lib/x86_64-linux-gnu/cmake/absl")

# ---- 1. the core without Gloo
cmake -S . -B build-gpu "${GEN[@]}" "${COMMON[@]}" -DOMNI_BUILD_TORCH=OFF \
  -DCMAKE_PREFIX_PATH="$DEPS" 2>&1 | tee "$LOG/configure.log"
grep -q "OMNI_HAVE_NCCL=1" "$LOG/configure.log" || {
  echo "FAIL: NCCL not found"
  exit 1
}
bounded 300 cmake --build build-gpu -j "$(nproc)" --target omni omni_core_tests >"$LOG/build.log" 2>&1 || {
  tail -n 40 "$LOG/build.log"
  echo "FAIL: the core did not build"
  exit 1
}
echo "core build: $(grep -c 'warning:' "$LOG/build.log" || true) warning(s) with this compiler"
export LD_LIBRARY_PATH="$DEPS/lib:$DEPS/lib/x86_64-linux-gnu:${NCCL_HOME:+$NCCL_HOME/lib:}${LD_LIBRARY_PATH:-}"

./build-gpu/bin/omni info | tee "$LOG/info.txt" || true
if grep -q "CUDA device(s)" "$LOG/info.txt"; then
  pass "omni info finds NCCL and a CUDA device"
else
  fail "omni info found no CUDA device"
fi

# ---- 2 and 3. The communicator and elastic checks fork one process per
# GPU; this process must not touch CUDA first, so they run on their own
# (and bounded: a hang is a failure).
set +e
bounded 300 ./build-gpu/bin/omni_core_tests --gtest_filter='CommNccl*:CommStaging*:*ElasticBackend*/nccl' \
  --gtest_output="xml:$LOG/comm_nccl.xml" 2>&1 | tee "$LOG/comm_nccl.log"
rc=${PIPESTATUS[0]}
set -e
count_gtest "$LOG/comm_nccl.log" "$rc" "comm_nccl + elastic over nccl"
for t in CommNcclGpu.SingleGpuCollectivesOnDeviceAndHostMemoryAbortAndReinit \
  Backends/ElasticBackend.OneReplicaRecoversFromAnAbortedCommunicatorAndRejoinsAfterARestart/nccl; do
  grep -q "^\[       OK \] ${t} " "$LOG/comm_nccl.log" || fail "${t} did not pass (or did not run)"
done

# ---- 4 to 7. The LibTorch adapters and omni_train against the host's
# PyTorch 2.x. Needs a CXX11-ABI LibTorch (as the bundled abseil is); an
# older ABI is reported and counted as a failure.
TORCH_PREFIX="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)"
TORCH_ABI="$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null || true)"
if [ -z "$TORCH_PREFIX" ]; then
  fail "no PyTorch on this host"
elif [ "$TORCH_ABI" != "1" ]; then
  fail "PyTorch uses the pre-CXX11 ABI; omni::torch needs a CXX11-ABI LibTorch here"
else
  set +e
  cmake -S . -B build-gpu-torch "${GEN[@]}" "${COMMON[@]}" -DOMNI_BUILD_TORCH=ON \
    -DCMAKE_PREFIX_PATH="$DEPS;$TORCH_PREFIX" >"$LOG/configure_torch.log" 2>&1 &&
    bounded 300 cmake --build build-gpu-torch -j "$(nproc)" --target omni_torch_tests omni_train omni \
      >"$LOG/build_torch.log" 2>&1
  rc=$?
  set -e
  if [ "$rc" -ne 0 ]; then
    tail -n 30 "$LOG/configure_torch.log" "$LOG/build_torch.log"
    fail "omni_torch_tests / omni_train did not build against PyTorch (exit ${rc})"
  else
    T=./build-gpu-torch/bin/omni_train

    # 4. Two runs of omni_train --device cuda (with dropout, which draws
    #    from the CUDA generator) give one params_xxh3.
    a=$(bounded 120 "$T" --device cuda --dropout 0.1 --steps 60 --eval-every 20 --quiet 2>&1 | tail -n 1 || true)
    b=$(bounded 120 "$T" --device cuda --dropout 0.1 --steps 60 --eval-every 20 --quiet 2>&1 | tail -n 1 || true)
    echo "cuda run 1: $a"
    echo "cuda run 2: $b"
    if [[ "$a" == final* && "$a" == "$b" ]]; then
      pass "two CUDA runs of omni_train give one params_xxh3"
    else
      fail "two CUDA runs of omni_train differ (or failed)"
    fi

    # 5. Elastic CUDA training through omni::Runtime: one replica over NCCL
    #    (this build has no Gloo: --store on CUDA must pick NCCL, or the
    #    replica fails at its join). SIGTERM twice (the second signal saves
    #    at the next boundary, whatever the step time), exit 75; started
    #    again, it rejoins the job's store under its id, resumes from the
    #    job-level checkpoint and ends where a straight run ends.
    E="$LOG/elastic_cuda"
    rm -rf "$E"
    mkdir -p "$E"
    ELASTIC=("$T" --device cuda --dropout 0.1 --steps 120 --eval-every 0 --quiet --max-replicas 1
      --replica-id r0)
    ref=$(bounded 120 "${ELASTIC[@]}" --store "file://$E/ref-store" 2>"$E/ref.err" | tail -n 1 || true)
    echo "elastic cuda straight: $ref"
    RUN=("${ELASTIC[@]}" --store "file://$E/store" --ckpt-dir "$E/ckpt" --loss-log "$E/loss.log")
    OMNI_PREEMPT_GRACE_S=600 "${RUN[@]}" >"$E/run1.out" 2>"$E/run1.err" &
    pid=$!
    for _ in $(seq 1 600); do
      if ! kill -0 "$pid" 2>/dev/null; then break; fi
      if [ -f "$E/loss.log" ] && [ "$(wc -l <"$E/loss.log")" -ge 20 ]; then break; fi
      sleep 0.1
    done
    kill -TERM "$pid" 2>/dev/null || true
    sleep 0.05
    kill -TERM "$pid" 2>/dev/null || true
    set +e
    bounded 60 tail --pid="$pid" -f /dev/null
    kill -KILL "$pid" 2>/dev/null # still there after a minute: hung
    wait "$pid"
    rc1=$?
    steps1=$(grep -c . "$E/loss.log" 2>/dev/null || true)
    resumed=$(OMNI_PREEMPT_GRACE_S=600 bounded 120 "${RUN[@]}" 2>"$E/run2.err" | tail -n 1)
    rc2=$?
    set -e
    echo "elastic cuda preempted: exit ${rc1} after ${steps1:-0} steps"
    echo "elastic cuda resumed:   exit ${rc2}, $resumed"
    if [[ "$ref" != final* ]]; then
      tail -n 20 "$E/ref.err"
      fail "elastic CUDA straight run failed"
    elif [ "$rc1" -ne 75 ]; then
      tail -n 20 "$E/run1.err"
      fail "elastic CUDA run: SIGTERM gave exit ${rc1}, not 75"
    elif [ "$rc2" -ne 0 ] || [ "$resumed" != "$ref" ]; then
      tail -n 20 "$E/run2.err"
      fail "elastic CUDA resume: exit ${rc2}, '${resumed}' != straight '${ref}'"
    elif ! grep -q "resumed from" "$E/run2.err" || ! grep -q "joined: generation 2" "$E/run2.err"; then
      tail -n 20 "$E/run2.err"
      fail "elastic CUDA resume did not restore a checkpoint and rejoin the job"
    else
      pass "elastic CUDA training (NCCL) resumes bit-exactly after SIGTERM"
    fi

    # 6. omni_torch_tests on LibTorch 2.x, with every CUDA device's
    #    generator saved and restored (TorchState.*Cuda*).
    set +e
    bounded 180 ./build-gpu-torch/bin/omni_torch_tests 2>&1 | tee "$LOG/torch.log"
    rc=${PIPESTATUS[0]}
    set -e
    count_gtest "$LOG/torch.log" "$rc" "torch"
    grep -q '^\[       OK \] TorchState.RngStateRestoresEveryCudaGenerator' "$LOG/torch.log" ||
      fail "the CUDA generator check did not pass"

    # 7. The preemption tests (SIGTERM at several steps, SIGKILL at random
    #    moments, notices, a corrupt checkpoint) on CUDA: every resumed run
    #    equals the uninterrupted one bit for bit.
    set +e
    OMNI_BIN_DIR="$PWD/build-gpu-torch/bin" OMNI_TRAIN_EXTRA="--device cuda" PYTHONUNBUFFERED=1 \
      bounded 400 python3 -m pytest -q -p no:cacheprovider -rs \
      --junitxml="$LOG/preemption_cuda.xml" tests/integration/test_preemption.py 2>&1 |
      tee "$LOG/preemption_cuda.log"
    rc=${PIPESTATUS[0]}
    set -e
    n_all=$(grep -o '<testcase ' "$LOG/preemption_cuda.xml" 2>/dev/null | wc -l || true)
    n_bad=$(grep -Eo '<(failure|error)' "$LOG/preemption_cuda.xml" 2>/dev/null | wc -l || true)
    n_skip=$(grep -o '<skipped' "$LOG/preemption_cuda.xml" 2>/dev/null | wc -l || true)
    n_ok=$((n_all - n_bad - n_skip))
    echo "preemption on cuda: ${n_ok} ok, ${n_bad} failed, ${n_skip} skipped (exit ${rc})"
    if [ "$rc" -eq 0 ]; then
      passed=$((passed + n_ok))
    else
      failed=$((failed + (n_bad > 0 ? n_bad : 1)))
    fi
  fi
fi

echo "elapsed ${SECONDS} s of ${BUDGET_S} s"
echo "${passed} passed, ${failed} failed"
[ "$failed" -eq 0 ]
