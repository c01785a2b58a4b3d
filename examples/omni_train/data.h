// Synthetic image+text samples and the data-loader thread of omni_train.
// Torch-free: batches are plain buffers; the trainer wraps them in tensors.
//
// Every sample is a pure function of (seed, stream, index):
//  * a class c in [0, kClasses) and a quadrant q in [0, 4);
//  * a 16x16x3 image: class colour, a bright square in quadrant q, noise
//    (made at 64x64 and box-downsampled, as a decoder would);
//  * 16 text tokens: a per-class "caption" with the quadrant as its second
//    token, each token replaced by a random one with probability 0.15.
// So the text is a noisy function of the image and the loss goes down.
//
// Decode cost: each image sample also gets a number of smoothing passes over
// its 64x64 source, drawn from a heavy-tailed distribution seeded by the
// sample index (times --stall-scale): 99% are still images costing ~0.1 ms,
// 1% are frames of video clips costing tens of milliseconds (lognormal), as
// image and video decoding does. The passes are real CPU work on a scratch
// copy; the pixels given to the model do not depend on them, so the stall
// scale changes timing only, never the parameters.
//
// Shards (--shard-batches N, --shard-fetch-ms MS): the training stream is
// stored in shards of N global batches on remote storage, fetched on
// demand: the trainer waits for a shard's fetch (a blocking wait of about
// MS, ±10% per shard, deterministic in the seed) before it takes the
// shard's first batch, as a streaming loader that refills its buffer when
// it runs dry does. A data stall every N-th step.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "omni/sampler.h"

namespace omni_train {

inline constexpr int kImageSize = 16;  // model input is kChannels x 16 x 16
inline constexpr int kChannels = 3;
inline constexpr int kSourceScale = 4;  // decoded at 64 x 64, then downsampled
inline constexpr int kTextLen = 16;
inline constexpr int kVocab = 64;
inline constexpr int kClasses = 8;
// Training samples per epoch; the order of each epoch comes from
// omni::DistributedSampler (seed, epoch), so a resumed or resized run sees
// every sample exactly once per epoch.
inline constexpr int64_t kDatasetSize = 4096;

struct DataConfig {
  uint64_t seed = 1;
  int batch = 8;
  bool text_only = false;
  double stall_scale = 1.0;  // multiplies the decode pass count; 0 = none
  // The decode cost as a blocking wait of the same modelled length (kPassNs
  // per pass: a fetch from remote storage) instead of CPU work, so that a data
  // stall leaves the core idle (what a CPU host can lend a guest).
  bool stall_io = false;
  int64_t shard_batches = 0;  // global batches per shard; 0 = no shard fetches
  double shard_fetch_ms = 0;  // the median fetch of one shard
};

// The fetch wait before global batch `batch_number` (its step): non-zero
// only for the first batch of a shard.
int64_t ShardFetchNs(const DataConfig& config, int64_t batch_number);
// Waits ShardFetchNs (a blocking wait: the core is idle meanwhile).
void FetchShardOf(const DataConfig& config, int64_t batch_number);

// The modelled cost of one decode pass (one 3x3 smoothing of 64x64x3 on one core).
inline constexpr int64_t kPassNs = 35'000;

// Sample streams: training samples and the held-out eval set never overlap.
inline constexpr uint64_t kTrainStream = 0;
inline constexpr uint64_t kEvalStream = 1;

struct Batch {
  int64_t index = 0;               // batch number in its stream
  int size = 0;                    // samples
  std::vector<float> images;       // [size, 3, 16, 16], empty when text-only
  std::vector<int64_t> text;       // [size, kTextLen]
  std::vector<int32_t> labels;     // [size] image class
  std::vector<int32_t> quadrants;  // [size] where the square is
  int64_t decode_passes = 0;       // smoothing passes spent decoding
  int64_t max_sample_passes = 0;   // ... on the costliest sample
  double decode_checksum = 0;      // result of that work (keeps it real)
};

// The decode pass count of one sample (deterministic in seed and index).
int64_t DecodePasses(const DataConfig& config, uint64_t stream, uint64_t index);

// Builds samples [batch_index * batch, (batch_index + 1) * batch) of
// `stream`; with `decode`, spends the heavy-tailed decode cost on each image.
Batch MakeBatch(const DataConfig& config, uint64_t stream, int64_t batch_index, bool decode);
// Builds the samples `indices` of `stream`.
Batch MakeBatchOf(const DataConfig& config, uint64_t stream, int64_t batch_index,
                  const std::vector<int64_t>& indices, bool decode);

// The per-class caption tokens, for host-side eval scoring.
std::vector<int64_t> CaptionOf(const DataConfig& config, int label, int quadrant);

// A background thread that builds the next `num_batches` training batches
// that `sampler` yields from cursor `start`, in order, at most `prefetch` of
// them ahead of the trainer (ready or being built). It uses its own copy of
// the sampler and never moves the trainer's: the trainer commits a batch when
// it consumes it, so prefetched but unconsumed samples are not counted as
// seen (a checkpoint saves the committed cursor; a resume rebuilds them). The
// destructor stops and joins the thread.
class DataLoader {
 public:
  DataLoader(const DataConfig& config, const omni::DistributedSampler& sampler,
             omni::SamplerCursor start, int64_t num_batches, int prefetch);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Blocks until the next batch is ready. OutOfRange after the last batch;
  // Internal if the loader thread failed.
  absl::StatusOr<Batch> Next();

  int64_t total_decode_passes() const;
  int64_t max_sample_decode_passes() const;

 private:
  void Run();
  bool CanPop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CanPush() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DataConfig config_;
  const omni::DistributedSampler sampler_;
  const omni::SamplerCursor start_;
  const int64_t num_batches_;
  const size_t prefetch_;
  mutable absl::Mutex mu_;
  std::deque<Batch> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // the thread has exited
  std::string error_ ABSL_GUARDED_BY(mu_);
  int64_t popped_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t total_passes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t max_passes_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace omni_train
