#include "omni/comm.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/comm_internal.h"
#include "omni/config.h"

namespace omni {

size_t DataTypeSize(DType type) {
  switch (type) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
      return 1;
    default:  // not reduced by communicators
      return 0;
  }
}

const char* DataTypeName(DType type) {
  switch (type) {
    case DType::kF32:
      return "float32";
    case DType::kF64:
      return "float64";
    case DType::kI32:
      return "int32";
    case DType::kI64:
      return "int64";
    case DType::kU8:
      return "uint8";
    default:
      return "unsupported";
  }
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Shrink(
    const std::vector<int>& /*excluded*/, absl::Duration /*timeout*/) {
  return absl::UnimplementedError(absl::StrCat(
      backend(), " communicators cannot shrink; build a new one with CreateCommunicator"));
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(const CommOptions& options) {
  const bool gloo = options.backend == "gloo";
  const bool nccl = options.backend == "nccl";
  if (!gloo && !nccl) {
    return absl::InvalidArgumentError(absl::StrCat("CommOptions.backend: unknown backend '",
                                                   options.backend, "' (expected gloo or nccl)"));
  }
  if (options.size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CommOptions.size: ", options.size, " is not >= 1"));
  }
  if (options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("CommOptions.rank: ", options.rank,
                                                   " is out of range [0, ", options.size, ")"));
  }
  if (options.store == nullptr) {
    return absl::InvalidArgumentError("CommOptions.store: no store given (it is required)");
  }
  if (!(options.init_timeout > absl::ZeroDuration())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CommOptions.init_timeout: ", absl::FormatDuration(options.init_timeout), " is not > 0"));
  }
  if (gloo) {
#if OMNI_HAVE_GLOO
    return internal::CreateGlooCommunicator(options);
#else
    return absl::UnimplementedError("CommOptions.backend: omni was built without Gloo");
#endif
  }
  if (nccl && options.device < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CommOptions.device: ", options.device, " is not a device ordinal or -1"));
  }
#if OMNI_HAVE_NCCL
  return internal::CreateNcclCommunicator(options);
#else
  return absl::UnimplementedError("CommOptions.backend: omni was built without NCCL");
#endif
}

namespace internal {

namespace {
std::string ArriveKey(int r) { return absl::StrCat("arrive/", r); }
}  // namespace

absl::Status AnnounceRank(Store& store, int rank, const std::string& what) {
  if (absl::Status s = store.Set(ArriveKey(rank), "1"); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(what, " rendezvous: rank ", rank,
                                               " could not announce itself: ", s.message()));
  }
  return absl::OkStatus();
}

namespace {
constexpr absl::Duration kRendezvousSlice = absl::Milliseconds(20);

absl::Status Abandoned(const std::string& what, const std::string& waiting_for) {
  return absl::AbortedError(absl::StrCat(what, " rendezvous abandoned while waiting for ",
                                         waiting_for, " (a peer of this generation is gone)"));
}

const absl::Status& StatusOf(const absl::Status& s) { return s; }
const absl::Status& StatusOf(const absl::StatusOr<std::string>& v) { return v.status(); }

// Calls `wait(timeout)` until `deadline`: at once for the whole time without
// `abandon`, else in slices, asking `abandon` before each.
template <typename Wait>
auto InSlices(absl::Time deadline, const std::function<bool()>& abandon, const std::string& what,
              const std::string& waiting_for, Wait wait) -> decltype(wait(absl::Duration())) {
  if (!abandon) return wait(deadline - absl::Now());
  for (;;) {
    if (abandon()) return Abandoned(what, waiting_for);
    const absl::Duration left = deadline - absl::Now();
    auto r = wait(std::min(left, kRendezvousSlice));
    if (r.ok() || !absl::IsDeadlineExceeded(StatusOf(r)) || left <= kRendezvousSlice) return r;
  }
}
}  // namespace

absl::StatusOr<std::string> RendezvousGet(Store& store, const std::string& key, absl::Time deadline,
                                          const std::function<bool()>& abandon,
                                          const std::string& what) {
  return InSlices(deadline, abandon, what, absl::StrCat("'", key, "'"),
                  [&](absl::Duration t) { return store.Get(key, t); });
}

absl::Status RendezvousWait(Store& store, const std::vector<std::string>& keys, absl::Time deadline,
                            const std::function<bool()>& abandon, const std::string& what) {
  return InSlices(deadline, abandon, what, absl::StrCat(keys.size(), " arrival key(s)"),
                  [&](absl::Duration t) { return store.Wait(keys, t); });
}

absl::Status WaitForRanks(Store& store, int rank, int size, absl::Time deadline,
                          absl::Duration init_timeout, const std::function<bool()>& abandon,
                          const std::string& what) {
  if (absl::Status s = AnnounceRank(store, rank, what); !s.ok()) return s;
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) keys.push_back(ArriveKey(r));
  absl::Status s = RendezvousWait(store, keys, deadline, abandon, what);
  if (s.ok() || absl::IsAborted(s)) return s;
  if (s.code() != absl::StatusCode::kDeadlineExceeded) {
    return absl::Status(s.code(), absl::StrCat(what, " rendezvous: ", s.message()));
  }
  return MissingRanksError(store, rank, size, init_timeout, what);
}

absl::Status MissingRanksError(Store& store, int rank, int size, absl::Duration init_timeout,
                               const std::string& what) {
  const auto key = ArriveKey;
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    absl::StatusOr<std::optional<std::string>> v = store.TryGet(key(r));
    if (!v.ok() || !v->has_value()) missing.push_back(r);
  }
  if (missing.empty()) return absl::OkStatus();  // the last one arrived just in time
  return absl::DeadlineExceededError(
      absl::StrCat(what, " rendezvous: rank(s) ", absl::StrJoin(missing, ", "), " of ", size,
                   " did not arrive within ", absl::FormatDuration(init_timeout),
                   " (seen from rank ", rank, ")"));
}

absl::Status CheckTimeout(absl::Duration timeout, const char* call) {
  if (timeout > absl::ZeroDuration()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(call, ": timeout ", absl::FormatDuration(timeout), " is not > 0"));
}

absl::Status CheckAllReduceArgs(const void* data, size_t count, DType type,
                                absl::Duration timeout) {
  if (absl::Status s = CheckTimeout(timeout, "AllReduce"); !s.ok()) return s;
  const size_t elem = DataTypeSize(type);
  if (elem == 0) {
    return absl::InvalidArgumentError(absl::StrCat("AllReduce: dtype ", DTypeName(type),
                                                   " is not reduced by communicators (F32, F64, "
                                                   "I32, I64, U8)"));
  }
  if (count > std::numeric_limits<size_t>::max() / elem) {
    return absl::InvalidArgumentError(absl::StrCat("AllReduce: count ", count, " is too large"));
  }
  if (count > 0 && data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("AllReduce: data is null with count ", count));
  }
  return absl::OkStatus();
}

absl::Status CheckBroadcastArgs(const void* data, size_t bytes, int root, int size,
                                absl::Duration timeout) {
  if (absl::Status s = CheckTimeout(timeout, "Broadcast"); !s.ok()) return s;
  if (root < 0 || root >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: root ", root, " is out of range [0, ", size, ")"));
  }
  if (bytes > 0 && data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("Broadcast: data is null with ", bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status CheckAllGatherArgs(const void* in, size_t bytes, const void* out, int size,
                                absl::Duration timeout) {
  if (absl::Status s = CheckTimeout(timeout, "AllGather"); !s.ok()) return s;
  if (bytes > std::numeric_limits<size_t>::max() / static_cast<size_t>(size)) {
    return absl::InvalidArgumentError(absl::StrCat("AllGather: ", bytes, " bytes is too large"));
  }
  if (bytes > 0 && (in == nullptr || out == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("AllGather: ", in == nullptr ? "in" : "out",
                                                   " is null with ", bytes, " bytes"));
  }
  return absl::OkStatus();
}

std::string CallName(const char* call, size_t bytes) {
  return absl::StrCat(call, " of ", bytes, " bytes");
}

}  // namespace internal
}  // namespace omni
