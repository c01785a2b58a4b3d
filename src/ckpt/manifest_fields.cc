#include "ckpt/manifest_fields.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace omni::ckpt {
namespace {

// Whether j[key] is an integer in [lo, hi] (0 ≤ lo ≤ hi). A non-negative
// integer parsed from text is unsigned in nlohmann::json; one above
// INT64_MAX is refused rather than wrapped.
bool IntegerIn(const nlohmann::json& j, const char* key, uint64_t lo, uint64_t hi) {
  if (!j.contains(key) || !j[key].is_number_unsigned()) return false;
  const auto v = j[key].get<uint64_t>();
  return v >= lo && v <= hi;
}

}  // namespace

std::optional<std::string> ReadManifestFields(const nlohmann::json& j, ManifestFields& f) {
  if (!IntegerIn(j, "step", 0, std::numeric_limits<int64_t>::max())) return "no valid step";
  f.step = j["step"].get<int64_t>();
  if (!IntegerIn(j, "world_size", 1, 99999)) return "no valid world_size";
  f.world_size = j["world_size"].get<int>();
  if (j.contains("library_version") && j["library_version"].is_string()) {
    f.library_version = j["library_version"].get<std::string>();
  }
  if (j.contains("job_id") && j["job_id"].is_string()) f.job_id = j["job_id"].get<std::string>();
  if (j.contains("created_unix_ms") && j["created_unix_ms"].is_number_integer()) {
    f.created_unix_ms = j["created_unix_ms"].get<int64_t>();
  }
  if (j.contains("metadata")) {
    if (!j["metadata"].is_object()) return "metadata is not an object";
    for (const auto& [k, v] : j["metadata"].items()) {
      if (!v.is_string()) return absl::StrCat("metadata '", k, "' is not a string");
      f.metadata[k] = v.get<std::string>();
    }
  }
  return std::nullopt;
}

}  // namespace omni::ckpt
