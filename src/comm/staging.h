// Host memory through a device communicator (private): the decisions of the
// NCCL backend's staging, kept free of CUDA types so that they are tested on
// hosts without a GPU (tests/unit/comm_staging_test.cc).
//
// NCCL reads and writes device memory only. The NCCL communicator takes
// host memory too (the elastic group's digests and state, the Runtime's
// small all-reduces) and copies it through a device buffer of at most
// kStageBytes, one chunk after another: every chunk is one NCCL collective,
// so every rank must pass the same kind of memory to one call (comm.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace omni::internal {

// The device buffer a staged collective goes through, at most.
inline constexpr size_t kStageBytes = size_t{64} << 20;

// What a pointer is, as cudaPointerGetAttributes reports it (the values of
// cudaMemoryType).
enum class MemoryType { kUnregistered = 0, kHost = 1, kDevice = 2, kManaged = 3 };

struct PointerInfo {
  MemoryType type = MemoryType::kUnregistered;
  int device = -1;  // for kDevice: the CUDA ordinal it belongs to
};

// Whether a communicator on CUDA device `comm_device` passes `p` to NCCL as
// it is (true: device memory of that device) or stages it (false: pageable
// or pinned host memory, managed memory). InvalidArgument naming the call
// and the argument for device memory of another device (NCCL would fault or
// read the wrong memory).
inline absl::StatusOr<bool> UsesDirectly(const PointerInfo& p, int comm_device, const char* call,
                                         const char* arg) {
  if (p.type != MemoryType::kDevice) return false;
  if (p.device == comm_device) return true;
  return absl::InvalidArgumentError(absl::StrCat(call, ": ", arg, " is memory of CUDA device ",
                                                 p.device, "; this communicator runs on device ",
                                                 comm_device));
}

// One piece of a staged collective: `bytes` bytes at `offset`.
struct StageChunk {
  size_t offset = 0;
  size_t bytes = 0;
};

// The pieces of `total` bytes of elements `unit` bytes wide, each at most
// `max_bytes` (rounded down to whole elements, at least one element), in
// order; none for total 0. `unit` must divide `total`.
inline std::vector<StageChunk> StageChunks(size_t total, size_t unit, size_t max_bytes) {
  std::vector<StageChunk> out;
  if (unit == 0) return out;
  const size_t step = std::max(unit, max_bytes / unit * unit);
  for (size_t at = 0; at < total; at += step) out.push_back({at, std::min(step, total - at)});
  return out;
}

// The per-rank piece of an AllGather staged through a buffer of
// `stage_bytes`: the buffer holds the piece of every rank (size * piece).
inline size_t GatherPieceBytes(size_t stage_bytes, int size) {
  return std::max<size_t>(1, stage_bytes / static_cast<size_t>(std::max(size, 1)));
}

}  // namespace omni::internal
