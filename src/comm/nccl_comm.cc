// NCCL backend: CUDA device buffers. Compiled whenever the CUDA toolkit and
// NCCL are found (OMNI_HAVE_NCCL), including on hosts without a GPU, where
// CreateCommunicator returns FailedPrecondition naming the CUDA error.
//
// Nothing here blocks without a bound. The communicator is non-blocking
// (ncclConfig_t.blocking = 0): init, shrink and every collective return at
// once and are then polled (ncclCommGetAsyncError, cudaStreamQuery) until
// done, an error, the deadline or Abort(). On anything but success the NCCL
// communicator is aborted (ncclCommAbort, which also ends kernels still
// running on the internal stream) and the error is latched.
//
// Host memory: NCCL reads and writes device memory only, so a buffer that
// is not device memory of this communicator's device (cudaPointerGetAttributes)
// is copied through a device staging buffer (src/comm/staging.h), at most
// 64 MiB at a time, one collective per chunk, on the same stream and under
// the same deadline and abort checks. Device memory of another device is
// InvalidArgument. The staging buffer grows on demand and lives as long as
// the communicator.
//
// Threads: one thread at a time runs a collective; it holds op_mu_ while it
// touches comm_. Abort() only sets a flag and latches Aborted; the running
// call sees the flag in its poll loop and aborts comm_ itself. When no call is
// running, Abort() takes op_mu_ and aborts comm_ right away, so peers blocked
// in a collective with this rank fail too instead of waiting.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/comm_internal.h"
#include "comm/staging.h"
#include "omni/comm.h"
#include "omni/nccl.h"
#include "omni/store.h"

namespace omni::internal {
namespace {

// ncclCommShrink appeared in NCCL 2.27.
constexpr int kShrinkMinVersion = 22700;
// How long a healthy communicator may take to finalize when destroyed
// before it is aborted instead.
constexpr absl::Duration kFinalizeTimeout = absl::Seconds(5);
constexpr char kUniqueIdKey[] = "nccl/unique_id";

std::string CudaError(cudaError_t e) {
  return absl::StrCat(cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

// The status for a failed NCCL call or a failed asynchronous state.
absl::Status FromNccl(ncclResult_t r, ncclComm_t comm, const std::string& what) {
  std::string detail = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') absl::StrAppend(&detail, ": ", last);
  switch (r) {
    case ncclSystemError:
    case ncclRemoteError:
      return absl::UnavailableError(absl::StrCat(what, ": a peer or the network failed: ", detail));
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InternalError(absl::StrCat(what, ": NCCL rejected the call: ", detail));
    default:
      return absl::InternalError(absl::StrCat(what, ": ", detail));
  }
}

// Sleeps a little longer each time: 20 us doubling up to 1 ms.
class Backoff {
 public:
  void Sleep() {
    std::this_thread::sleep_for(std::chrono::microseconds(us_));
    us_ = std::min(us_ * 2, 1000);
  }

 private:
  int us_ = 20;
};

// Polls the asynchronous state of `comm` until it leaves ncclInProgress, the
// deadline passes (DeadlineExceeded) or *abort becomes true (Aborted).
absl::Status WaitReady(ncclComm_t comm, absl::Time deadline, absl::Duration timeout,
                       const std::atomic<bool>* abort, const std::string& what,
                       const std::function<bool()>& abandon = nullptr) {
  Backoff backoff;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return FromNccl(r, comm, what);
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return FromNccl(state, comm, what);
    if (abort != nullptr && abort->load()) {
      return absl::AbortedError(absl::StrCat(what, ": aborted (Abort() called)"));
    }
    if (abandon && abandon()) {  // CommOptions::abandon, while the ranks connect
      return absl::AbortedError(
          absl::StrCat(what,
                       ": rendezvous abandoned while initializing (a peer of this "
                       "generation is gone)"));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": did not finish within ", absl::FormatDuration(timeout)));
    }
    backoff.Sleep();
  }
}

// Owns an ncclComm_t; aborts it unless released.
class OwnedComm {
 public:
  explicit OwnedComm(ncclComm_t c = nullptr) : c_(c) {}
  ~OwnedComm() { Abort(); }
  OwnedComm(OwnedComm&& o) noexcept : c_(o.Release()) {}
  OwnedComm& operator=(OwnedComm&& o) noexcept {
    if (this != &o) {
      Abort();
      c_ = o.Release();
    }
    return *this;
  }
  OwnedComm(const OwnedComm&) = delete;
  OwnedComm& operator=(const OwnedComm&) = delete;

  ncclComm_t get() const { return c_; }
  ncclComm_t Release() { return std::exchange(c_, nullptr); }
  void Abort() {
    if (c_ != nullptr) ncclCommAbort(std::exchange(c_, nullptr));
  }

 private:
  ncclComm_t c_;
};

struct StreamDeleter {
  void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
};
using StreamPtr = std::unique_ptr<CUstream_st, StreamDeleter>;
struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DevicePtr = std::unique_ptr<void, DeviceFree>;

ncclDataType_t ToNccl(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    default:  // kU8; the other types are refused by CheckAllReduceArgs
      return ncclUint8;
  }
}

ncclRedOp_t ToNccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;  // floats: pre-multiplied by 1/n; integers: sum, then divided
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

ncclConfig_t NonBlockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, int device, OwnedComm comm, StreamPtr stream,
                   DevicePtr scratch)
      : rank_(rank),
        size_(size),
        device_(device),
        stream_(std::move(stream)),
        scratch_(std::move(scratch)),
        comm_(std::move(comm)) {}

  ~NcclCommunicator() override {
    absl::MutexLock op(&op_mu_);
    if (comm_.get() == nullptr) return;
    cudaSetDevice(device_);
    if (AsyncError().ok() && !abort_requested_.load()) {
      // Healthy: flush and free (bounded), then destroy; abort otherwise.
      const ncclResult_t r = ncclCommFinalize(comm_.get());
      if ((r == ncclSuccess || r == ncclInProgress) &&
          WaitReady(comm_.get(), absl::Now() + kFinalizeTimeout, kFinalizeTimeout, nullptr,
                    "ncclCommFinalize")
              .ok()) {
        ncclCommDestroy(comm_.Release());
        return;
      }
    }
    comm_.Abort();
  }

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }

  absl::Status AllReduce(void* data, size_t count, DType type, ReduceOp op,
                         absl::Duration timeout) override {
    if (absl::Status s = CheckAllReduceArgs(data, count, type, timeout); !s.ok()) return s;
    if (count == 0) return AsyncError();
    const size_t elem = DataTypeSize(type);
    absl::MutexLock lock(&op_mu_);
    absl::StatusOr<Call> call =
        BeginLocked(absl::StrCat("nccl AllReduce(", ReduceOpName(op), ", ", count, " x ",
                                 DataTypeName(type), ") on rank ", rank_, " of ", size_),
                    timeout);
    if (!call.ok()) return call.status();
    absl::StatusOr<bool> direct = UsesDirectly(Where(data), device_, "AllReduce", "data");
    if (!direct.ok()) return direct.status();
    if (*direct) {
      return CollectiveLocked(*call, [&](ncclComm_t c, cudaStream_t stream) {
        return ncclAllReduce(data, data, count, ToNccl(type), ToNccl(op), c, stream);
      });
    }
    char* host = static_cast<char*>(data);
    for (const StageChunk& chunk : StageChunks(count * elem, elem, kStageBytes)) {
      absl::StatusOr<void*> buf = StageLocked(*call, chunk.bytes);
      if (!buf.ok()) return buf.status();
      absl::Status st = CopyLocked(*call, *buf, host + chunk.offset, chunk.bytes);
      if (st.ok()) {
        st = CollectiveLocked(*call, [&](ncclComm_t c, cudaStream_t stream) {
          return ncclAllReduce(*buf, *buf, chunk.bytes / elem, ToNccl(type), ToNccl(op), c, stream);
        });
      }
      if (st.ok()) st = CopyLocked(*call, host + chunk.offset, *buf, chunk.bytes);
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }

  absl::Status Broadcast(void* data, size_t bytes, int root, absl::Duration timeout) override {
    if (absl::Status s = CheckBroadcastArgs(data, bytes, root, size_, timeout); !s.ok()) {
      return s;
    }
    if (bytes == 0) return AsyncError();
    absl::MutexLock lock(&op_mu_);
    absl::StatusOr<Call> call =
        BeginLocked(absl::StrCat("nccl Broadcast(", bytes, " bytes from root ", root, ") on rank ",
                                 rank_, " of ", size_),
                    timeout);
    if (!call.ok()) return call.status();
    absl::StatusOr<bool> direct = UsesDirectly(Where(data), device_, "Broadcast", "data");
    if (!direct.ok()) return direct.status();
    if (*direct) {
      return CollectiveLocked(*call, [&](ncclComm_t c, cudaStream_t stream) {
        return ncclBroadcast(data, data, bytes, ncclUint8, root, c, stream);
      });
    }
    char* host = static_cast<char*>(data);
    for (const StageChunk& chunk : StageChunks(bytes, 1, kStageBytes)) {
      absl::StatusOr<void*> buf = StageLocked(*call, chunk.bytes);
      if (!buf.ok()) return buf.status();
      // Only the root's bytes travel in; only the others' come back out.
      absl::Status st;
      if (rank_ == root) st = CopyLocked(*call, *buf, host + chunk.offset, chunk.bytes);
      if (st.ok()) {
        st = CollectiveLocked(*call, [&](ncclComm_t c, cudaStream_t stream) {
          return ncclBroadcast(*buf, *buf, chunk.bytes, ncclUint8, root, c, stream);
        });
      }
      if (st.ok() && rank_ != root) {
        st = CopyLocked(*call, host + chunk.offset, *buf, chunk.bytes);
      }
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }

  absl::Status AllGather(const void* in, size_t bytes, void* out, absl::Duration timeout) override {
    if (absl::Status s = CheckAllGatherArgs(in, bytes, out, size_, timeout); !s.ok()) return s;
    if (bytes == 0) return AsyncError();
    absl::MutexLock lock(&op_mu_);
    absl::StatusOr<Call> call = BeginLocked(
        absl::StrCat("nccl AllGather(", bytes, " bytes per rank) on rank ", rank_, " of ", size_),
        timeout);
    if (!call.ok()) return call.status();
    absl::StatusOr<bool> in_direct = UsesDirectly(Where(in), device_, "AllGather", "in");
    if (!in_direct.ok()) return in_direct.status();
    absl::StatusOr<bool> out_direct = UsesDirectly(Where(out), device_, "AllGather", "out");
    if (!out_direct.ok()) return out_direct.status();
    if (*in_direct && *out_direct) {
      return CollectiveLocked(*call, [&](ncclComm_t c, cudaStream_t stream) {
        return ncclAllGather(in, out, bytes, ncclUint8, c, stream);
      });
    }
    // Each chunk: this rank's piece is copied to its slot of the device
    // buffer, gathered in place, and every rank's piece copied out to its
    // place in `out`.
    const char* src = static_cast<const char*>(in);
    char* dst = static_cast<char*>(out);
    for (const StageChunk& chunk : StageChunks(bytes, 1, GatherPieceBytes(kStageBytes, size_))) {
      absl::StatusOr<void*> stage = StageLocked(*call, chunk.bytes * static_cast<size_t>(size_));
      if (!stage.ok()) return stage.status();
      char* buf = static_cast<char*>(*stage);
      char* mine = buf + static_cast<size_t>(rank_) * chunk.bytes;
      absl::Status st = CopyLocked(*call, mine, src + chunk.offset, chunk.bytes);
      if (st.ok()) {
        st = CollectiveLocked(*call, [&](ncclComm_t c, cudaStream_t stream) {
          return ncclAllGather(mine, buf, chunk.bytes, ncclUint8, c, stream);
        });
      }
      for (size_t r = 0; st.ok() && r < static_cast<size_t>(size_); ++r) {
        st = EnqueueCopyLocked(*call, dst + r * bytes + chunk.offset, buf + r * chunk.bytes,
                               chunk.bytes);
      }
      if (st.ok()) st = WaitStreamLocked(*call);
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }

  absl::Status Barrier(absl::Duration timeout) override {
    if (absl::Status s = CheckTimeout(timeout, "Barrier"); !s.ok()) return s;
    // NCCL has no barrier: an all-reduce of one int on a scratch buffer.
    void* scratch = scratch_.get();
    absl::MutexLock lock(&op_mu_);
    absl::StatusOr<Call> call =
        BeginLocked(absl::StrCat("nccl Barrier on rank ", rank_, " of ", size_), timeout);
    if (!call.ok()) return call.status();
    return CollectiveLocked(*call, [&](ncclComm_t c, cudaStream_t stream) {
      return ncclAllReduce(scratch, scratch, 1, ncclInt32, ncclSum, c, stream);
    });
  }

  void Abort() override {
    if (abort_requested_.exchange(true)) return;
    Latch(absl::AbortedError(absl::StrCat("nccl communicator of rank ", rank_, " of ", size_,
                                          " was aborted (Abort() called)")))
        .IgnoreError();
    // Idle: abort now so that peers waiting on this rank fail too. Busy: the
    // running call sees the flag within a millisecond and aborts.
    if (op_mu_.TryLock()) {
      AbortCommLocked();
      op_mu_.Unlock();
    }
  }

  absl::Status AsyncError() const override {
    absl::MutexLock l(&mu_);
    return error_;
  }

  absl::StatusOr<std::unique_ptr<Communicator>> Shrink(const std::vector<int>& excluded,
                                                       absl::Duration timeout) override;

 private:
  // Where `p` lives (cudaPointerGetAttributes; plain host memory when the
  // runtime does not know the pointer). Asked after BeginLocked, on device_.
  static PointerInfo Where(const void* p) {
    cudaPointerAttributes a;
    std::memset(&a, 0, sizeof(a));
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();  // CUDA < 11 reports host memory as an error: clear it
      return PointerInfo{};
    }
    return PointerInfo{static_cast<MemoryType>(a.type), a.device};
  }

  // One call in progress: what it is (for errors) and its time bound.
  struct Call {
    std::string what;
    absl::Time deadline;
    absl::Duration timeout;
  };

  // The start of every call, under op_mu_: the latched error, or Aborted
  // after Abort(); else the call, with this thread on device_.
  absl::StatusOr<Call> BeginLocked(std::string what, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_) {
    if (absl::Status s = AsyncError(); !s.ok()) return s;
    if (abort_requested_.load() || comm_.get() == nullptr) {
      return BreakLocked(absl::AbortedError(absl::StrCat(what, ": aborted (Abort() called)")));
    }
    Call call{std::move(what), absl::Now() + timeout, timeout};
    if (const cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      cudaGetLastError();
      return BreakLocked(absl::InternalError(
          absl::StrCat(call.what, ": cudaSetDevice(", device_, "): ", CudaError(e))));
    }
    return call;
  }

  // One collective: enqueue on the internal stream, then poll until done.
  template <typename Enqueue>
  absl::Status CollectiveLocked(const Call& call, Enqueue&& enqueue)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_) {
    const ncclResult_t r = enqueue(comm_.get(), stream_.get());
    if (r == ncclInProgress) {
      // Non-blocking: the enqueue itself may still be running.
      if (absl::Status s =
              WaitReady(comm_.get(), call.deadline, call.timeout, &abort_requested_, call.what);
          !s.ok()) {
        return BreakLocked(std::move(s));
      }
    } else if (r != ncclSuccess) {
      return BreakLocked(FromNccl(r, comm_.get(), call.what));
    }
    return WaitStreamLocked(call);
  }

  // Queues a copy of `bytes` between host and device memory (either way)
  // on the internal stream, after what is queued there.
  absl::Status EnqueueCopyLocked(const Call& call, void* dst, const void* src, size_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_) {
    if (const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_.get());
        e != cudaSuccess) {
      cudaGetLastError();
      return BreakLocked(absl::InternalError(
          absl::StrCat(call.what, ": staging copy of ", bytes, " bytes: ", CudaError(e))));
    }
    return absl::OkStatus();
  }

  // EnqueueCopyLocked, then waits for it.
  absl::Status CopyLocked(const Call& call, void* dst, const void* src, size_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_) {
    if (absl::Status s = EnqueueCopyLocked(call, dst, src, bytes); !s.ok()) return s;
    return WaitStreamLocked(call);
  }

  // The device buffer host memory is staged through, at least `bytes` long
  // (grown on demand, kept for the next call). ResourceExhausted (latched:
  // the peers would wait for this rank's part) when it cannot be allocated.
  absl::StatusOr<void*> StageLocked(const Call& call, size_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_) {
    if (stage_bytes_ >= bytes) return stage_.get();
    stage_.reset();
    stage_bytes_ = 0;
    // Small requests (digests, a loss) round up to 1 MiB: one allocation.
    const size_t want = std::max(bytes, size_t{1} << 20);
    void* raw = nullptr;
    if (const cudaError_t e = cudaMalloc(&raw, want); e != cudaSuccess) {
      cudaGetLastError();
      return BreakLocked(absl::ResourceExhaustedError(
          absl::StrCat(call.what, ": cudaMalloc of a ", want,
                       "-byte staging buffer for host memory: ", CudaError(e))));
    }
    stage_.reset(raw);
    stage_bytes_ = want;
    return raw;
  }

  // Polls the internal stream until its work is done, NCCL reports an
  // error, the deadline passes or Abort() is called (each breaks the
  // communicator).
  absl::Status WaitStreamLocked(const Call& call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_) {
    Backoff backoff;
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_.get());
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) {
        cudaGetLastError();
        return BreakLocked(absl::InternalError(absl::StrCat(call.what, ": CUDA: ", CudaError(q))));
      }
      ncclResult_t state = ncclSuccess;
      const ncclResult_t a = ncclCommGetAsyncError(comm_.get(), &state);
      if (a != ncclSuccess) return BreakLocked(FromNccl(a, comm_.get(), call.what));
      if (state != ncclSuccess && state != ncclInProgress) {
        return BreakLocked(FromNccl(state, comm_.get(), call.what));
      }
      if (abort_requested_.load()) {
        return BreakLocked(
            absl::AbortedError(absl::StrCat(call.what, ": aborted (Abort() called)")));
      }
      if (absl::Now() >= call.deadline) {
        return BreakLocked(absl::DeadlineExceededError(absl::StrCat(
            call.what, ": a peer did not answer within ", absl::FormatDuration(call.timeout))));
      }
      backoff.Sleep();
    }
  }

  // Latches `s` unless an error is latched already; returns the latched one.
  absl::Status Latch(absl::Status s) {
    absl::MutexLock l(&mu_);
    if (error_.ok()) error_ = std::move(s);
    return error_;
  }

  absl::Status BreakLocked(absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_) {
    absl::Status latched = Latch(std::move(s));
    AbortCommLocked();
    return latched;
  }

  void AbortCommLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(op_mu_) {
    if (comm_.get() == nullptr) return;
    cudaSetDevice(device_);
    comm_.Abort();
  }

  const int rank_;
  const int size_;
  const int device_;
  const StreamPtr stream_;
  const DevicePtr scratch_;                  // one int, for Barrier
  DevicePtr stage_ ABSL_GUARDED_BY(op_mu_);  // host memory goes through it
  size_t stage_bytes_ ABSL_GUARDED_BY(op_mu_) = 0;
  std::atomic<bool> abort_requested_{false};
  absl::Mutex op_mu_;
  OwnedComm comm_ ABSL_GUARDED_BY(op_mu_);
  mutable absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

// Wraps an initialized NCCL communicator with its stream and scratch buffer.
absl::StatusOr<std::unique_ptr<Communicator>> Wrap(int rank, int size, int device, OwnedComm comm,
                                                   const std::string& who) {
  cudaStream_t raw_stream = nullptr;
  if (const cudaError_t e = cudaStreamCreateWithFlags(&raw_stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(absl::StrCat(who, ": cudaStreamCreate: ", CudaError(e)));
  }
  StreamPtr stream(raw_stream);
  void* raw_scratch = nullptr;
  if (const cudaError_t e = cudaMalloc(&raw_scratch, sizeof(int)); e != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat(who, ": cudaMalloc: ", CudaError(e)));
  }
  DevicePtr scratch(raw_scratch);
  if (const cudaError_t e = cudaMemset(raw_scratch, 0, sizeof(int)); e != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(absl::StrCat(who, ": cudaMemset: ", CudaError(e)));
  }
  return std::make_unique<NcclCommunicator>(rank, size, device, std::move(comm), std::move(stream),
                                            std::move(scratch));
}

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::Shrink(
    const std::vector<int>& excluded, absl::Duration timeout) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  const int version = NcclLibraryVersion();
  if (version < kShrinkMinVersion) {
    return absl::UnimplementedError(
        absl::StrCat("Shrink: the loaded NCCL ", version,
                     " has no ncclCommShrink (needs >= 2.27); build a new communicator"));
  }
  if (absl::Status s = CheckTimeout(timeout, "Shrink"); !s.ok()) return s;
  std::set<int> seen;
  for (int r : excluded) {
    if (r < 0 || r >= size_ || r == rank_ || !seen.insert(r).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("Shrink: excluded rank ", r,
                       r == rank_ ? " is the caller's own rank" : " is out of range or repeated",
                       " (size ", size_, ")"));
    }
  }
  if (excluded.empty() || static_cast<int>(excluded.size()) >= size_) {
    return absl::InvalidArgumentError(absl::StrCat("Shrink: excluding ", excluded.size(), " of ",
                                                   size_, " ranks leaves none or all"));
  }
  if (absl::Status s = AsyncError(); !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("Shrink: the communicator is broken (", s.message(), "); build a new one"));
  }
  const int new_rank = rank_ - static_cast<int>(std::count_if(excluded.begin(), excluded.end(),
                                                              [this](int r) { return r < rank_; }));
  const int new_size = size_ - static_cast<int>(excluded.size());
  const std::string what = absl::StrCat("nccl Shrink(excluding ", absl::StrJoin(excluded, ", "),
                                        ") on rank ", rank_, " of ", size_);
  absl::MutexLock op(&op_mu_);
  if (abort_requested_.load() || comm_.get() == nullptr) {
    return BreakLocked(absl::AbortedError(absl::StrCat(what, ": aborted (Abort() called)")));
  }
  const absl::Time deadline = absl::Now() + timeout;
  cudaSetDevice(device_);
  std::vector<int> list(excluded);
  ncclConfig_t config = NonBlockingConfig();
  ncclComm_t raw = nullptr;
  const ncclResult_t r = ncclCommShrink(comm_.get(), list.data(), static_cast<int>(list.size()),
                                        &raw, &config, NCCL_SHRINK_DEFAULT);
  OwnedComm child(raw);
  if (r != ncclSuccess && r != ncclInProgress) {
    return BreakLocked(FromNccl(r, comm_.get(), what));
  }
  if (child.get() == nullptr) {
    return BreakLocked(absl::InternalError(absl::StrCat(what, ": NCCL returned no communicator")));
  }
  if (absl::Status s = WaitReady(child.get(), deadline, timeout, &abort_requested_, what);
      !s.ok()) {
    return BreakLocked(std::move(s));
  }
  return Wrap(new_rank, new_size, device_, std::move(child), what);
#else
  (void)excluded;
  (void)timeout;
  return absl::UnimplementedError(
      absl::StrCat("Shrink: omni was built against NCCL ", NCCL_VERSION_CODE,
                   ", which has no ncclCommShrink (needs >= 2.27); build a new communicator"));
#endif
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const CommOptions& options) {
  const absl::Time deadline = absl::Now() + options.init_timeout;
  const std::string who = absl::StrCat("nccl rank ", options.rank, " of ", options.size);
  // The device first: without one, fail before waiting for anybody.
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later CUDA calls are not poisoned
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": no usable CUDA device: cudaGetDeviceCount: ", CudaError(e)));
  }
  if (devices == 0) {
    return absl::FailedPreconditionError(absl::StrCat(who, ": no CUDA device is visible"));
  }
  const int device = options.device >= 0 ? options.device : options.rank % devices;
  if (device >= devices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CommOptions.device: ", device, " is not below the ", devices, " visible CUDA device(s)"));
  }
  if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": cudaSetDevice(", device, "): ", CudaError(e)));
  }

  if (absl::Status s = WaitForRanks(*options.store, options.rank, options.size, deadline,
                                    options.init_timeout, options.abandon, "nccl");
      !s.ok()) {
    return s;
  }
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (options.rank == 0) {
    if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      return FromNccl(r, nullptr, absl::StrCat(who, ": ncclGetUniqueId"));
    }
    if (absl::Status s = options.store->Set(kUniqueIdKey, std::string(id.internal, sizeof(id)));
        !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat(who, ": publishing the NCCL unique id: ", s.message()));
    }
  } else {
    absl::StatusOr<std::string> v =
        RendezvousGet(*options.store, kUniqueIdKey, deadline, options.abandon, "nccl");
    if (!v.ok()) {
      if (v.status().code() == absl::StatusCode::kDeadlineExceeded) {
        return absl::DeadlineExceededError(
            absl::StrCat(who, ": rank 0 did not publish the NCCL unique id within ",
                         absl::FormatDuration(options.init_timeout)));
      }
      return absl::Status(
          v.status().code(),
          absl::StrCat(who, ": reading the NCCL unique id: ", v.status().message()));
    }
    if (v->size() != sizeof(id)) {
      return absl::InternalError(absl::StrCat(who, ": the NCCL unique id in the store has ",
                                              v->size(), " bytes, not ", sizeof(id)));
    }
    std::memcpy(&id, v->data(), sizeof(id));
  }

  ncclConfig_t config = NonBlockingConfig();
  ncclComm_t raw = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&raw, options.size, id, options.rank, &config);
  OwnedComm comm(raw);  // aborted on every early return below
  const std::string what = absl::StrCat(who, ": ncclCommInitRankConfig");
  if (r != ncclSuccess && r != ncclInProgress) return FromNccl(r, raw, what);
  if (comm.get() == nullptr) {
    return absl::InternalError(absl::StrCat(what, ": NCCL returned no communicator"));
  }
  if (absl::Status s =
          WaitReady(comm.get(), deadline, options.init_timeout, nullptr, what, options.abandon);
      !s.ok()) {
    return s;
  }
  return Wrap(options.rank, options.size, device, std::move(comm), who);
}

}  // namespace omni::internal
