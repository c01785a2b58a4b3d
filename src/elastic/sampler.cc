#include "omni/sampler.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/strings.h"

namespace omni {
namespace {

// Programmer misuse (documented preconditions): a checked assertion.
[[noreturn]] void Misuse(const std::string& what) {
  std::fprintf(stderr, "omni::DistributedSampler: %s\n", what.c_str());
  std::abort();
}

// splitmix64 (Steele, Lea, Flood 2014): the finalizer alone, and one step of
// the generator. Plain uint64 arithmetic: the same on every platform.
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

constexpr uint64_t Finalize(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

constexpr uint64_t SplitMix64(uint64_t x) { return Finalize(x + kGolden); }

// A keyed bijection of [0, n): a balanced Feistel network over the smallest
// even number of bits 2h with 2^(2h) >= n, restricted to [0, n) by cycle
// walking (apply again until the value falls inside; terminates because the
// network is a permutation, and takes fewer than 4 rounds on average since
// 2^(2h) < 4n). O(1) memory; no table.
class FeistelPermutation {
 public:
  static constexpr int kRounds = 6;

  FeistelPermutation(int64_t n, uint64_t seed, int64_t epoch) : n_(static_cast<uint64_t>(n)) {
    int bits = 0;
    while (bits < 64 && (n_ - 1) >> bits != 0) ++bits;  // bits to hold n - 1
    half_ = (bits + 1) / 2;
    mask_ = half_ == 0 ? 0 : (~0ULL >> (64 - half_));
    uint64_t state =
        SplitMix64(seed) ^ SplitMix64(static_cast<uint64_t>(epoch) ^ 0xD1B54A32D192ED03ULL);
    for (uint64_t& k : keys_) {
      state += kGolden;
      k = Finalize(state);
    }
  }

  int64_t At(int64_t i) const {
    if (half_ == 0) return 0;  // n == 1
    uint64_t x = static_cast<uint64_t>(i);
    do {
      x = Encrypt(x);
    } while (x >= n_);
    return static_cast<int64_t>(x);
  }

 private:
  uint64_t Encrypt(uint64_t x) const {
    uint64_t left = x >> half_;
    uint64_t right = x & mask_;
    for (uint64_t k : keys_) {
      const uint64_t next = left ^ (Finalize(right ^ k) & mask_);
      left = right;
      right = next;
    }
    return (left << half_) | right;
  }

  uint64_t n_;
  int half_ = 0;
  uint64_t mask_ = 0;
  uint64_t keys_[kRounds] = {};
};

constexpr int kStateVersion = 1;
constexpr const char* kStateKey = "cursor";

}  // namespace

absl::StatusOr<DistributedSampler> DistributedSampler::Create(const SamplerOptions& options) {
  if (options.dataset_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SamplerOptions.dataset_size must be positive, got ", options.dataset_size));
  }
  if (options.global_batch <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SamplerOptions.global_batch must be positive, got ", options.global_batch));
  }
  if (options.global_batch > options.dataset_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("SamplerOptions.global_batch (", options.global_batch,
                     ") is larger than dataset_size (", options.dataset_size, ")"));
  }
  return DistributedSampler(options);
}

SamplerCursor DistributedSampler::Normalize(const SamplerCursor& at) const {
  if (at.epoch < 0 || at.offset < 0) {
    Misuse(absl::StrCat("negative cursor {epoch ", at.epoch, ", offset ", at.offset, "}"));
  }
  const int64_t n = options_.dataset_size;
  const int64_t left = n - std::min(at.offset, n);
  if (left == 0 || (options_.drop_last && left < options_.global_batch)) {
    return SamplerCursor{at.epoch + 1, 0};
  }
  return at;
}

absl::StatusOr<std::vector<int64_t>> DistributedSampler::Batch(int replica,
                                                               int num_replicas) const {
  return BatchAt(cursor_, replica, num_replicas);
}

absl::StatusOr<std::vector<int64_t>> DistributedSampler::BatchAt(const SamplerCursor& at,
                                                                 int replica,
                                                                 int num_replicas) const {
  if (num_replicas < 1 || num_replicas > options_.global_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_replicas (", num_replicas,
                     ") must be in [1, global_batch = ", options_.global_batch, "]"));
  }
  if (replica < 0 || replica >= num_replicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica (", replica, ") must be in [0, ", num_replicas, ")"));
  }
  if (at.epoch < 0 || at.offset < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cursor {epoch ", at.epoch, ", offset ", at.offset, "} must not be negative"));
  }
  const SamplerCursor c = Normalize(at);
  const int64_t size = std::min(options_.global_batch, options_.dataset_size - c.offset);
  const int64_t base = size / num_replicas;
  const int64_t extra = size % num_replicas;
  const int64_t begin = c.offset + replica * base + std::min<int64_t>(replica, extra);
  const int64_t count = base + (replica < extra ? 1 : 0);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(count));
  if (!options_.shuffle) {
    for (int64_t i = 0; i < count; ++i) out.push_back(begin + i);
    return out;
  }
  const FeistelPermutation perm(options_.dataset_size, options_.seed, c.epoch);
  for (int64_t i = 0; i < count; ++i) out.push_back(perm.At(begin + i));
  return out;
}

SamplerCursor DistributedSampler::Next(const SamplerCursor& at) const {
  const SamplerCursor c = Normalize(at);
  const int64_t size = std::min(options_.global_batch, options_.dataset_size - c.offset);
  return Normalize(SamplerCursor{c.epoch, c.offset + size});
}

int64_t DistributedSampler::batches_per_epoch() const {
  const int64_t n = options_.dataset_size;
  const int64_t b = options_.global_batch;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

int64_t DistributedSampler::IndexAt(int64_t epoch, int64_t i) const {
  if (i < 0 || i >= options_.dataset_size || epoch < 0) {
    Misuse(absl::StrCat("IndexAt(epoch ", epoch, ", i ", i, "): need epoch >= 0 and i in [0, ",
                        options_.dataset_size, ")"));
  }
  if (!options_.shuffle) return i;
  return FeistelPermutation(options_.dataset_size, options_.seed, epoch).At(i);
}

absl::Status DistributedSampler::Save(StateWriter& writer) const {
  const nlohmann::json j = {
      {"version", kStateVersion},
      {"seed", options_.seed},
      {"dataset_size", options_.dataset_size},
      {"global_batch", options_.global_batch},
      {"shuffle", options_.shuffle},
      {"drop_last", options_.drop_last},
      {"epoch", cursor_.epoch},
      {"offset", cursor_.offset},
  };
  return writer.PutBytes(kStateKey, j.dump());
}

absl::Status DistributedSampler::Load(const StateReader& reader) {
  auto bytes = reader.ReadBytes(kStateKey);
  if (!bytes.ok()) return bytes.status();
  const auto bad = [](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler state '", kStateKey, "': ", internal::Sv(why)));
  };
  const nlohmann::json j = nlohmann::json::parse(*bytes, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  // Integer fields; `out` is only written when the field is present and integral.
  const auto get_int = [&j](const char* field, int64_t* out) {
    auto it = j.find(field);
    if (it == j.end() || !it->is_number_integer()) return false;
    if (it->is_number_unsigned() &&
        it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return false;
    }
    *out = it->get<int64_t>();
    return true;
  };
  int64_t version = 0;
  if (!get_int("version", &version) || version < 1) return bad("field version is missing or bad");
  if (version > kStateVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("sampler state '", kStateKey, "': field version ", version,
                     " is newer than this Omni reads (", kStateVersion, ")"));
  }
  auto seed_it = j.find("seed");
  if (seed_it == j.end() || !seed_it->is_number_unsigned()) {
    return bad("field seed is missing or not an unsigned integer");
  }
  const uint64_t seed = seed_it->get<uint64_t>();
  if (seed != options_.seed) {
    return bad(
        absl::StrCat("field seed ", seed, " differs from this sampler's seed ", options_.seed));
  }
  int64_t dataset_size = 0;
  if (!get_int("dataset_size", &dataset_size)) return bad("field dataset_size is missing or bad");
  if (dataset_size != options_.dataset_size) {
    return bad(absl::StrCat("field dataset_size ", dataset_size,
                            " differs from this sampler's dataset_size ", options_.dataset_size));
  }
  int64_t global_batch = 0;
  if (!get_int("global_batch", &global_batch)) return bad("field global_batch is missing or bad");
  if (global_batch != options_.global_batch) {
    return bad(absl::StrCat("field global_batch ", global_batch,
                            " differs from this sampler's global_batch ", options_.global_batch));
  }
  auto shuffle_it = j.find("shuffle");
  if (shuffle_it == j.end() || !shuffle_it->is_boolean()) {
    return bad("field shuffle is missing or not a boolean");
  }
  if (shuffle_it->get<bool>() != options_.shuffle) {
    return bad(absl::StrCat("field shuffle ", shuffle_it->get<bool>() ? "true" : "false",
                            " differs from this sampler's shuffle ",
                            options_.shuffle ? "true" : "false"));
  }
  int64_t epoch = 0;
  int64_t offset = 0;
  if (!get_int("epoch", &epoch) || epoch < 0) return bad("field epoch is missing or negative");
  if (!get_int("offset", &offset) || offset < 0 || offset > options_.dataset_size) {
    return bad(absl::StrCat(
        "field offset is missing or not in [0, dataset_size = ", options_.dataset_size, "]"));
  }
  // drop_last may differ: it only decides the end of an epoch, from here on
  // this sampler's value holds.
  cursor_ = Normalize(SamplerCursor{epoch, offset});
  return absl::OkStatus();
}

}  // namespace omni
