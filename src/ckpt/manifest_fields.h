// What both checkpoint manifest layouts share (the per-rank layout of
// rank_manifest.cc and the job layout of job_manifest.cc): their common fields
// and the parser of their parts (digests, integers, tensor entries). Private
// to omni_core.
//
// Thread safety: plain functions.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/safetensors.h"
#include "omni/checkpoint.h"
#include "omni/state.h"

namespace omni::ckpt {

// The "format" of a manifest of either layout.
constexpr const char* kManifestFormat = "omni.checkpoint";

struct ManifestFields {
  int64_t step = 0;
  int world_size = 1;
  std::string library_version;  // "" when absent
  std::string job_id;           // "" when absent
  int64_t created_unix_ms = 0;  // 0 when absent
  std::map<std::string, std::string> metadata;

  // The CheckpointInfo of a step directory at `path` holding these fields,
  // in layout version `version`, of `bytes` bytes of shards.
  CheckpointInfo Info(const std::string& path, int version, int64_t bytes) const;
};

// Reads the shared fields of the manifest object `j` into `f`. Returns the
// text of the first error (for the caller to prefix with the file's path):
// a missing or negative step, a world_size outside [1, 99999], metadata that
// is not an object of strings; nullopt when they are valid. The optional
// fields (library_version, job_id, created_unix_ms) are left at their
// defaults when absent or mistyped.
std::optional<std::string> ReadManifestFields(const nlohmann::json& j, ManifestFields& f);

// Reads the parts of a manifest (or of a fragment) at `path`: every
// structural problem is DataLoss naming the path, and `what` / the key
// where it is. The layouts' own parsers derive from it.
class ManifestParser {
 public:
  explicit ManifestParser(std::string path) : path_(std::move(path)) {}
  absl::Status Error(std::string_view what) const;
  // obj[field]: 16 lowercase hex digits (an XXH3 digest, a token).
  absl::StatusOr<uint64_t> Hex(const nlohmann::json& obj, const char* field,
                               std::string_view what) const;
  // obj[field]: a non-negative integer.
  absl::StatusOr<uint64_t> U64(const nlohmann::json& obj, const char* field,
                               std::string_view what) const;
  // obj[field]: [a, b] with 0 ≤ a ≤ b.
  absl::StatusOr<std::pair<uint64_t, uint64_t>> Pair(const nlohmann::json& obj, const char* field,
                                                     std::string_view what) const;
  // v's "dtype" and "shape", of a size TensorBytes accepts.
  absl::Status TypeAndShape(const nlohmann::json& v, const std::string& where, DType& dtype,
                            std::vector<int64_t>& shape) const;
  // A tensor entry under `key` (a valid state key): dtype, shape,
  // data_offsets holding exactly the tensor's bytes, xxh3.
  absl::StatusOr<TensorEntry> Entry(const nlohmann::json& v, const std::string& key) const;
  // The version of a manifest `j` of either layout: DataLoss unless its
  // "format" is "omni.checkpoint" and it has an integer "version".
  absl::StatusOr<int> FormatVersion(const nlohmann::json& j) const;

 private:
  std::string path_;
};

}  // namespace omni::ckpt
