// The per-rank checkpoint's manifest (private): its types, the JSON text of
// the manifest and of the fragments the ranks hand to rank 0, and their
// parsers. See include/omni/checkpoint.h for the format. Used by the manager
// (ckpt/checkpoint.cc) and the reader (ckpt/rank_reader.h); the job-level
// checkpoint's counterpart is ckpt/job_manifest.h.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/manifest_fields.h"
#include "ckpt/safetensors.h"
#include "ckpt/step_dirs.h"
#include "omni/checkpoint.h"

namespace omni::ckpt::rank {

constexpr const char* kFormat = kManifestFormat;
constexpr const char* kFragmentFormat = "omni.checkpoint.fragment";
constexpr int kVersion = 1;
constexpr const char* kManifest = "manifest.json";
// The largest manifest and fragment read (parsing JSON takes tens of times
// its size in memory); CheckpointManager::kMaxManifestBytes documents it.
constexpr size_t kMaxManifestBytes = CheckpointManager::kMaxManifestBytes;

// "rank-00003." and the names of rank 3's shard and fragment after it.
std::string RankPrefix(int rank);
std::string ShardFileName(int rank);
std::string FragmentName(int rank);

struct ShardRecord {
  int rank = 0;
  std::string file;
  uint64_t bytes = 0;
  uint64_t header_bytes = 0;
  uint64_t header_xxh3 = 0;
  uint64_t xxh3 = 0;
};

// The shared fields (step, world_size, library_version, job_id,
// created_unix_ms, metadata) come from ckpt::ManifestFields.
struct Manifest : ckpt::ManifestFields {
  std::string dir;  // the step directory it was read from
  int version = kVersion;
  std::vector<ShardRecord> shards;
  std::vector<std::vector<TensorEntry>> entries;  // per shard, in file order

  std::string ManifestPath() const { return Join(dir, kManifest); }
  std::string ShardPath(int rank) const { return Join(dir, shards[rank].file); }
  int64_t TotalBytes() const {
    int64_t n = 0;
    for (const ShardRecord& s : shards) n += static_cast<int64_t>(s.bytes);
    return n;
  }
  CheckpointInfo Info() const { return ManifestFields::Info(dir, version, TotalBytes()); }
};

// The manifest's JSON text (one line per shard and per entry).
std::string ManifestJson(const Manifest& m);
// Parses the manifest of the step directory `step_dir`. DataLoss naming the
// manifest's path (and the key) for any structural problem; FailedPrecondition
// for a newer format version or a job-level checkpoint.
absl::StatusOr<Manifest> ParseManifest(const std::string& text, const std::string& step_dir);

// What a rank hands to rank 0 for its shard of `step`: its record and its
// entries, as JSON text; and the parser, which checks that the fragment at
// `path` is for `step` and `rank` and that its entries fill the shard
// (DataLoss otherwise).
std::string FragmentJson(int64_t step, const ShardRecord& r, const std::vector<TensorEntry>& es);
absl::Status ParseFragment(const std::string& text, const std::string& path, int64_t step, int rank,
                           ShardRecord& rec, std::vector<TensorEntry>& entries);

}  // namespace omni::ckpt::rank
