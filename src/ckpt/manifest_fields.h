// The fields that both checkpoint manifest layouts carry (the per-rank
// layout of checkpoint.cc and the job layout of job_manifest.cc): one reader
// for both. Private to omni_core.
//
// Thread safety: plain functions.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace omni::ckpt {

struct ManifestFields {
  int64_t step = 0;
  int world_size = 1;
  std::string library_version;  // "" when absent
  std::string job_id;           // "" when absent
  int64_t created_unix_ms = 0;  // 0 when absent
  std::map<std::string, std::string> metadata;
};

// Reads the shared fields of the manifest object `j` into `f`. Returns the
// text of the first error (for the caller to prefix with the file's path):
// a missing or negative step, a world_size outside [1, 99999], metadata that
// is not an object of strings; nullopt when they are valid. The optional
// fields (library_version, job_id, created_unix_ms) are left at their
// defaults when absent or mistyped.
std::optional<std::string> ReadManifestFields(const nlohmann::json& j, ManifestFields& f);

}  // namespace omni::ckpt
