// The state serializer (private): a StateRegistry's state copied into host
// memory, and the one buffer format in which it travels between replicas.
// Both places that copy a state out of the trainer's memory use it:
//   - CheckpointManager::SaveAsync (checkpoint.cc) captures the state into
//     pooled blocks under max_snapshot_bytes; its worker thread writes the
//     items to the shard later;
//   - the elastic group's state transfer (SerializeState / DeserializeState
//     in state.h) captures the state, encodes the items into one buffer,
//     and on the receiving side decodes it and loads the registry through
//     an ItemReader.
//
// Exported (hidden otherwise) for tests/unit/state_snapshot_test.cc only.
//
// Thread safety: a StateSnapshot is used by one thread at a time (it may
// be handed to another thread); EncodeState / DecodeState are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "omni/export.h"
#include "omni/state.h"

namespace omni::ckpt {

// Anonymous memory, unmapped on destruction. 2 MiB-aligned and advised for
// transparent huge pages: a snapshot then takes a few hundred page faults
// instead of one per 4 KiB (3x faster copies of a large state).
class OMNI_EXPORT HostBlock {
 public:
  static constexpr size_t kAlign = size_t{2} << 20;
  // At least `size` bytes (rounded up to kAlign). Errors: mmap's, naming
  // the size.
  static absl::StatusOr<HostBlock> Map(size_t size);
  HostBlock(HostBlock&& o) noexcept;
  HostBlock& operator=(HostBlock&& o) noexcept;
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;
  ~HostBlock() { Unmap(); }
  char* data() const { return p_; }
  size_t size() const { return size_; }

 private:
  HostBlock(char* map, size_t mapped, char* p, size_t size)
      : map_(map), mapped_(mapped), p_(p), size_(size) {}
  void Unmap();
  char* map_ = nullptr;
  size_t mapped_ = 0;
  char* p_ = nullptr;
  size_t size_ = 0;
};

// One tensor of a captured or decoded state.
struct StateItem {
  std::string key;  // the full key ("model/weight")
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  const char* data = nullptr;  // nbytes bytes owned by the snapshot / buffer
  size_t nbytes = 0;
};

// A state copied into host memory: items packed 64-byte aligned into blocks
// of at least 64 MiB (a larger tensor gets a block of its own).
class OMNI_EXPORT StateSnapshot {
 public:
  // `pool`: blocks of an earlier snapshot, filled first (no page faults);
  // those left unused stay with this snapshot (TakeBlocks returns them).
  explicit StateSnapshot(std::vector<HostBlock> pool = {}) : pool_(std::move(pool)) {}
  StateSnapshot(StateSnapshot&&) = default;
  StateSnapshot& operator=(StateSnapshot&&) = default;
  StateSnapshot(const StateSnapshot&) = delete;
  StateSnapshot& operator=(const StateSnapshot&) = delete;
  ~StateSnapshot() = default;

  // Copies the state of every object of `state` (StateRegistry::SaveAll).
  // Call once. Errors: InvalidArgument naming the key for a malformed or
  // duplicate key or a size that does not match the dtype and shape;
  // ResourceExhausted once the copied bytes would exceed `max_bytes`
  // (over_limit() then says so); mmap's errors; the objects' own.
  absl::Status Capture(const StateRegistry& state,
                       size_t max_bytes = std::numeric_limits<size_t>::max());

  // In the order the objects saved them.
  const std::vector<StateItem>& items() const { return items_; }
  // The tensors' bytes (headers not counted).
  uint64_t bytes() const { return bytes_; }
  bool over_limit() const { return over_limit_; }
  // The memory (for the next snapshot: CheckpointOptions::keep_snapshot_memory).
  // The items point into it: do not read them afterwards.
  std::vector<HostBlock> TakeBlocks();

 private:
  class Writer;
  absl::Status Put(std::string_view key, DType dtype, std::vector<int64_t> shape, const void* data,
                   size_t nbytes, size_t max_bytes);
  std::vector<StateItem> items_;
  std::vector<HostBlock> blocks_;  // filled, the last one partly
  std::vector<HostBlock> pool_;    // not used yet
  std::unordered_set<std::string> keys_;
  uint64_t bytes_ = 0;
  size_t used_ = 0;  // of blocks_.back()
  bool over_limit_ = false;
};

// The state transfer's buffer: "OMNIST01", the item count (u64), then per
// item: key length (u32), key, dtype (u8, omni::DType), rank (u32), the
// dimensions (i64 each), the byte count (u64), the bytes. Host byte order.
OMNI_EXPORT std::string EncodeState(const std::vector<StateItem>& items);
// The items of a buffer made by EncodeState, pointing into `bytes` (which
// must outlive them). DataLoss naming the byte offset or the key for a
// truncated or malformed buffer (bad magic, header, size, a repeated key,
// trailing bytes).
OMNI_EXPORT absl::StatusOr<std::vector<StateItem>> DecodeState(std::string_view bytes);

// A StateReader over items that another owner keeps alive. `source` names
// them in errors ("the received state": NotFound "state key 'k' missing
// from the received state").
class OMNI_EXPORT ItemReader final : public StateReader {
 public:
  ItemReader(const std::vector<StateItem>& items, std::string source);
  absl::StatusOr<Info> Find(std::string_view key) const override;
  absl::Status ReadTensor(std::string_view key, DType dtype, const std::vector<int64_t>& shape,
                          void* dst, size_t nbytes) const override;
  absl::StatusOr<std::string> ReadBytes(std::string_view key) const override;
  std::vector<std::string> Keys(std::string_view prefix) const override;

 private:
  const StateItem* Lookup(std::string_view key) const;
  std::map<std::string, const StateItem*, std::less<>> by_key_;
  std::string source_;
};

}  // namespace omni::ckpt
