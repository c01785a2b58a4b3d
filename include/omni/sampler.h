// A resumable, deterministic distributed sampler. The order of an epoch is a
// permutation of [0, dataset_size) computed from (seed, epoch) with Omni's own
// generator (identical on every platform and standard library). A global
// cursor counts the samples consumed in the epoch; a global batch is the next
// `global_batch` samples of the permutation, split among the data-parallel
// replicas present at that step. Changing the number of replicas therefore
// re-partitions the rest of the epoch, and every sample is consumed exactly
// once per epoch across preemptions and resizes.
//
// Thread safety: not thread-safe; Batch() is const and may be called from a
// prefetching thread while the training thread only calls Commit() under the
// caller's own synchronization.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "omni/export.h"
#include "omni/state.h"

namespace omni {

struct SamplerOptions {
  int64_t dataset_size = 0;
  int64_t global_batch = 1;  // samples per optimizer step, all replicas together
  uint64_t seed = 0;
  bool shuffle = true;
  // The last incomplete global batch of an epoch is dropped (true) or
  // served short (false).
  bool drop_last = true;
};

// Position in the data: what has been consumed (committed) so far.
struct SamplerCursor {
  int64_t epoch = 0;
  int64_t offset = 0;  // samples of this epoch consumed by all replicas
};

class OMNI_EXPORT DistributedSampler final : public Stateful {
 public:
  // InvalidArgument naming the field for a non-positive size or batch, or a
  // batch larger than the dataset.
  static absl::StatusOr<DistributedSampler> Create(const SamplerOptions& options);

  // The sample indices of `replica` (of `num_replicas`) in the global batch
  // that starts at `at` (default: the committed cursor): positions
  // [offset, offset + global_batch) of the epoch's order, fewer at the end of
  // an epoch when drop_last is false. With drop_last, a cursor with fewer
  // than global_batch samples left in its epoch means the first batch of the
  // next epoch. Replica r gets a contiguous slice; slices differ in size by
  // at most one, the first replicas get the extra samples (in a short last
  // batch some replicas may get none). Pure: does not move the cursor, so a
  // loader may prefetch ahead. InvalidArgument for num_replicas outside
  // [1, global_batch], replica outside [0, num_replicas), a negative cursor.
  absl::StatusOr<std::vector<int64_t>> Batch(int replica, int num_replicas) const;
  absl::StatusOr<std::vector<int64_t>> BatchAt(const SamplerCursor& at, int replica,
                                               int num_replicas) const;
  // The cursor after the global batch that starts at `at` (rolls over to the
  // next epoch at its end). REQUIRES: `at` is not negative (checked: aborts).
  SamplerCursor Next(const SamplerCursor& at) const;

  // Marks the global batch at the committed cursor as consumed.
  void Commit() { cursor_ = Next(cursor_); }
  const SamplerCursor& cursor() const { return cursor_; }
  int64_t batches_per_epoch() const;
  const SamplerOptions& options() const { return options_; }

  // The sample at position `i` of epoch `epoch`'s order: a keyed Feistel
  // bijection (splitmix64 of (seed, epoch)) with cycle walking, O(1) memory;
  // the identity when shuffle is false. REQUIRES: epoch >= 0 and
  // 0 <= i < dataset_size (checked: aborts).
  int64_t IndexAt(int64_t epoch, int64_t i) const;

  // Stateful: saves one byte blob under key "cursor", JSON
  //   {version, seed, dataset_size, global_batch, shuffle, drop_last, epoch, offset}.
  // Load refuses (InvalidArgument naming the field) a different seed, dataset
  // size, global batch or shuffle, or a malformed blob; FailedPrecondition
  // for a blob of a newer version; the reader's error when the key is
  // missing. A different drop_last is accepted (this sampler's value decides
  // the epoch ends from then on). On error the sampler is unchanged.
  absl::Status Save(StateWriter& writer) const override;
  absl::Status Load(const StateReader& reader) override;

 private:
  explicit DistributedSampler(const SamplerOptions& options) : options_(options) {}
  // Where the global batch at `at` starts: the next epoch's start when `at`
  // is at the end of its epoch (or, with drop_last, within the last partial
  // batch).
  SamplerCursor Normalize(const SamplerCursor& at) const;
  SamplerOptions options_;
  SamplerCursor cursor_;
};

}  // namespace omni
