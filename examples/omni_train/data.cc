#include "data.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace omni_train {
namespace {

constexpr int kSource = kImageSize * kSourceScale;  // 64
constexpr double kTokenNoise = 0.15;
constexpr double kTwoPi = 6.283185307179586;

// Decode cost model, in smoothing passes over the 64x64 source (~35 us each
// on one core), before --stall-scale:
//  * 99% of samples are still images: Pareto(x_m = 2, alpha = 1.5) passes,
//    median ~3 (0.1 ms), mean 6;
//  * 1% come from video clips: the frame needs the clip decoded up to it,
//    lognormal(median 1200 passes, sigma 0.5), i.e. ~40 ms, up to ~150 ms.
// Capped at kMaxPasses. About 8% of batches of 8 hold a clip; with a few
// batches prefetched, most of those show up as data stalls.
constexpr double kImageBasePasses = 2.0;
constexpr double kImageAlpha = 1.5;
constexpr double kVideoFraction = 0.01;
constexpr double kVideoMedianPasses = 1200.0;
constexpr double kVideoSigma = 0.5;
constexpr double kMaxPasses = 4000.0;

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// A small deterministic generator (no std:: distributions: their output is
// implementation-defined).
class Rng {
 public:
  Rng(uint64_t a, uint64_t b, uint64_t c) : state_(a) {
    state_ = SplitMix64(state_) ^ b;
    state_ = SplitMix64(state_) ^ c;
    SplitMix64(state_);
  }
  uint64_t Next() { return SplitMix64(state_); }
  // Uniform in (0, 1].
  double Uniform() { return (static_cast<double>(Next() >> 11) + 1.0) * 0x1.0p-53; }
  int Below(int n) { return static_cast<int>(Next() % static_cast<uint64_t>(n)); }

 private:
  uint64_t state_;
};

// Salts separating the random draws of one sample.
constexpr uint64_t kSaltContent = 0x636F6E74656E74ULL;
constexpr uint64_t kSaltDecode = 0x6465636F6465ULL;
constexpr uint64_t kSaltCaption = 0x63617074696F6EULL;
constexpr uint64_t kSaltShard = 0x7368617264ULL;
constexpr double kShardFetchSigma = 0.05;

uint64_t SampleKey(uint64_t stream, uint64_t index) { return (stream << 56) ^ index; }

// One 3x3 box-smoothing pass (clamped borders) over a kChannels x n x n image.
void SmoothPass(const std::vector<float>& in, std::vector<float>& out, ptrdiff_t n) {
  for (ptrdiff_t c = 0; c < kChannels; ++c) {
    const float* src = in.data() + c * n * n;
    float* dst = out.data() + c * n * n;
    for (ptrdiff_t y = 0; y < n; ++y) {
      const float* rows[3] = {src + std::max<ptrdiff_t>(y - 1, 0) * n, src + y * n,
                              src + std::min<ptrdiff_t>(y + 1, n - 1) * n};
      for (ptrdiff_t x = 0; x < n; ++x) {
        const ptrdiff_t xl = std::max<ptrdiff_t>(x - 1, 0), xr = std::min<ptrdiff_t>(x + 1, n - 1);
        float s = 0;
        for (const float* r : rows) s += r[xl] + r[x] + r[xr];
        dst[y * n + x] = s * (1.0f / 9.0f);
      }
    }
  }
}

// Spends `passes` smoothing passes on a copy of `source`; returns a checksum
// of the result so the work cannot be optimized away.
double Decode(const std::vector<float>& source, int64_t passes) {
  if (passes <= 0) return 0;
  std::vector<float> a = source, b(source.size());
  for (int64_t p = 0; p < passes; ++p) {
    SmoothPass(a, b, kSource);
    a.swap(b);
  }
  double sum = 0;
  for (float v : a) sum += v;
  return sum;
}

// Writes one sample. `image` is null for text-only samples.
void MakeSample(const DataConfig& config, uint64_t stream, uint64_t index, bool decode,
                float* image, int64_t* text, int32_t* label, int32_t* quad, int64_t* passes,
                double* checksum) {
  Rng rng(config.seed, kSaltContent, SampleKey(stream, index));
  const int cls = rng.Below(kClasses);
  const int quadrant = rng.Below(4);
  *label = cls;
  *quad = quadrant;

  const std::vector<int64_t> caption = CaptionOf(config, cls, quadrant);
  for (int t = 0; t < kTextLen; ++t) {
    text[t] = rng.Uniform() < kTokenNoise ? rng.Below(kVocab) : caption[static_cast<size_t>(t)];
  }
  if (image == nullptr) return;

  // The 64x64 source: class colour, a bright square in the quadrant, noise.
  std::vector<float> source(static_cast<size_t>(kChannels) * kSource * kSource);
  const float brightness = static_cast<float>(0.8 + 0.4 * rng.Uniform());
  const int half = kSource / 2, side = kSource / 4;
  const int x0 = (quadrant % 2) * half + rng.Below(half - side);
  const int y0 = (quadrant / 2) * half + rng.Below(half - side);
  for (int c = 0; c < kChannels; ++c) {
    const float base = ((cls >> c) & 1) != 0 ? 0.7f : 0.25f;
    for (int y = 0; y < kSource; ++y) {
      for (int x = 0; x < kSource; ++x) {
        const bool in_square = x >= x0 && x < x0 + side && y >= y0 && y < y0 + side;
        const float noise = static_cast<float>(rng.Uniform() - 0.5) * 0.6f;
        source[(static_cast<size_t>(c) * kSource + y) * kSource + x] =
            (in_square ? 1.0f : base * brightness) + noise;
      }
    }
  }

  if (decode) {
    const int64_t n = DecodePasses(config, stream, index);
    *passes = n;
    if (config.stall_io) {
      std::this_thread::sleep_for(std::chrono::nanoseconds(n * kPassNs));
      *checksum = 0;
    } else {
      *checksum = Decode(source, n);
    }
  }

  // Box-downsample to 16x16 and normalize.
  constexpr float kNorm = 1.0f / (kSourceScale * kSourceScale);
  for (size_t c = 0; c < kChannels; ++c) {
    for (size_t y = 0; y < kImageSize; ++y) {
      for (size_t x = 0; x < kImageSize; ++x) {
        float s = 0;
        for (size_t dy = 0; dy < kSourceScale; ++dy) {
          for (size_t dx = 0; dx < kSourceScale; ++dx) {
            s += source[(c * kSource + y * kSourceScale + dy) * kSource + x * kSourceScale + dx];
          }
        }
        image[(c * kImageSize + y) * kImageSize + x] = (s * kNorm - 0.5f) * 4.0f;
      }
    }
  }
}

}  // namespace

int64_t DecodePasses(const DataConfig& config, uint64_t stream, uint64_t index) {
  if (config.text_only || config.stall_scale <= 0) return 0;
  Rng rng(config.seed, kSaltDecode, SampleKey(stream, index));
  double passes = 0;
  if (rng.Uniform() <= kVideoFraction) {
    // Box-Muller normal from two uniforms in (0, 1].
    const double z = std::sqrt(-2.0 * std::log(rng.Uniform())) * std::cos(kTwoPi * rng.Uniform());
    passes = kVideoMedianPasses * std::exp(kVideoSigma * z);
  } else {
    passes = kImageBasePasses * std::pow(rng.Uniform(), -1.0 / kImageAlpha);
  }
  return std::llround(std::min(passes, kMaxPasses) * config.stall_scale);
}

int64_t ShardFetchNs(const DataConfig& config, int64_t batch_number) {
  if (config.shard_batches <= 0 || config.shard_fetch_ms <= 0 || batch_number < 0 ||
      batch_number % config.shard_batches != 0) {
    return 0;
  }
  Rng rng(config.seed, kSaltShard, static_cast<uint64_t>(batch_number / config.shard_batches));
  const double z = std::sqrt(-2.0 * std::log(rng.Uniform())) * std::cos(kTwoPi * rng.Uniform());
  return std::llround(config.shard_fetch_ms * 1e6 * std::exp(kShardFetchSigma * z));
}

void FetchShardOf(const DataConfig& config, int64_t batch_number) {
  const int64_t ns = ShardFetchNs(config, batch_number);
  if (ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
}

std::vector<int64_t> CaptionOf(const DataConfig& config, int label, int quadrant) {
  Rng rng(config.seed, kSaltCaption, static_cast<uint64_t>(label));
  std::vector<int64_t> caption(kTextLen);
  for (int64_t& t : caption) t = rng.Below(kVocab);
  caption[0] = label;                // the first token names the class ...
  caption[1] = kClasses + quadrant;  // ... the second where the square is
  return caption;
}

Batch MakeBatch(const DataConfig& config, uint64_t stream, int64_t batch_index, bool decode) {
  std::vector<int64_t> indices(static_cast<size_t>(config.batch));
  for (size_t i = 0; i < indices.size(); ++i) {
    indices[i] = batch_index * config.batch + static_cast<int64_t>(i);
  }
  return MakeBatchOf(config, stream, batch_index, indices, decode);
}

Batch MakeBatchOf(const DataConfig& config, uint64_t stream, int64_t batch_index,
                  const std::vector<int64_t>& indices, bool decode) {
  Batch b;
  b.index = batch_index;
  b.size = static_cast<int>(indices.size());
  const size_t n = indices.size();
  constexpr size_t kImageFloats = static_cast<size_t>(kChannels) * kImageSize * kImageSize;
  if (!config.text_only) b.images.resize(n * kImageFloats);
  b.text.resize(n * kTextLen);
  b.labels.resize(n);
  b.quadrants.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const auto index = static_cast<uint64_t>(indices[i]);
    int64_t passes = 0;
    double checksum = 0;
    MakeSample(config, stream, index, decode,
               config.text_only ? nullptr : b.images.data() + i * kImageFloats,
               b.text.data() + i * kTextLen, &b.labels[i], &b.quadrants[i], &passes, &checksum);
    b.decode_passes += passes;
    b.max_sample_passes = std::max(b.max_sample_passes, passes);
    b.decode_checksum += checksum;
  }
  return b;
}

DataLoader::DataLoader(const DataConfig& config, const omni::DistributedSampler& sampler,
                       omni::SamplerCursor start, int64_t num_batches, int prefetch)
    : config_(config),
      sampler_(sampler),
      start_(start),
      num_batches_(num_batches),
      prefetch_(static_cast<size_t>(std::max(prefetch, 1))),
      thread_([this] { Run(); }) {}

DataLoader::~DataLoader() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

bool DataLoader::CanPop() const { return !queue_.empty() || done_; }
bool DataLoader::CanPush() const { return queue_.size() < prefetch_ || stop_; }

void DataLoader::Run() {
  std::string error;
  try {
    omni::SamplerCursor cursor = start_;
    for (int64_t i = 0; i < num_batches_; ++i) {
      // Wait for a free slot first: at most prefetch_ batches are ready or
      // being built ahead of the trainer.
      {
        absl::MutexLock lock(&mu_, absl::Condition(this, &DataLoader::CanPush));
        if (stop_) break;
      }
      absl::StatusOr<std::vector<int64_t>> indices = sampler_.BatchAt(cursor, 0, 1);
      if (!indices.ok()) throw std::runtime_error(std::string(indices.status().message()));
      Batch b = MakeBatchOf(config_, kTrainStream, i, *indices, /*decode=*/true);
      cursor = sampler_.Next(cursor);
      absl::MutexLock lock(&mu_);
      if (stop_) break;
      total_passes_ += b.decode_passes;
      max_passes_ = std::max(max_passes_, b.max_sample_passes);
      queue_.push_back(std::move(b));
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  absl::MutexLock lock(&mu_);
  error_ = std::move(error);
  done_ = true;
}

absl::StatusOr<Batch> DataLoader::Next() {
  absl::MutexLock lock(&mu_, absl::Condition(this, &DataLoader::CanPop));
  if (!queue_.empty()) {
    Batch b = std::move(queue_.front());
    queue_.pop_front();
    ++popped_;
    return b;
  }
  if (!error_.empty()) return absl::InternalError(absl::StrCat("data loader failed: ", error_));
  return absl::OutOfRangeError(absl::StrCat("data loader exhausted after ", popped_, " batches"));
}

int64_t DataLoader::total_decode_passes() const {
  absl::MutexLock lock(&mu_);
  return total_passes_;
}

int64_t DataLoader::max_sample_decode_passes() const {
  absl::MutexLock lock(&mu_);
  return max_passes_;
}

}  // namespace omni_train
