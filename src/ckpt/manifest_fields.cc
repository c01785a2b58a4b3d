#include "ckpt/manifest_fields.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/strings.h"

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

absl::Status ManifestParser::Error(std::string_view what) const {
  return absl::DataLossError(absl::StrCat(path_, ": ", internal::Sv(what)));
}

absl::StatusOr<uint64_t> ManifestParser::Hex(const nlohmann::json& obj, const char* field,
                                             std::string_view what) const {
  if (!obj.is_object() || !obj.contains(field) || !obj[field].is_string() ||
      obj[field].get<std::string>().size() != 16) {
    return Error(absl::StrCat(internal::Sv(what), ": '", field, "' is not 16 hex digits"));
  }
  uint64_t out = 0;
  for (const char c : obj[field].get<std::string>()) {
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    if (d < 0) {
      return Error(absl::StrCat(internal::Sv(what), ": '", field, "' is not lowercase hex"));
    }
    out = (out << 4) | static_cast<uint64_t>(d);
  }
  return out;
}

absl::StatusOr<uint64_t> ManifestParser::U64(const nlohmann::json& obj, const char* field,
                                             std::string_view what) const {
  if (!obj.is_object() || !obj.contains(field) || !obj[field].is_number_unsigned()) {
    return Error(
        absl::StrCat(internal::Sv(what), ": '", field, "' missing or not a non-negative integer"));
  }
  return obj[field].get<uint64_t>();
}

absl::StatusOr<std::pair<uint64_t, uint64_t>> ManifestParser::Pair(const nlohmann::json& obj,
                                                                   const char* field,
                                                                   std::string_view what) const {
  if (!obj.is_object() || !obj.contains(field) || !obj[field].is_array() ||
      obj[field].size() != 2 || !obj[field][0].is_number_unsigned() ||
      !obj[field][1].is_number_unsigned() ||
      obj[field][1].get<uint64_t>() < obj[field][0].get<uint64_t>()) {
    return Error(absl::StrCat(internal::Sv(what), ": '", field, "' is not an increasing pair"));
  }
  return std::make_pair(obj[field][0].get<uint64_t>(), obj[field][1].get<uint64_t>());
}

absl::Status ManifestParser::TypeAndShape(const nlohmann::json& v, const std::string& where,
                                          DType& dtype, std::vector<int64_t>& shape) const {
  if (!v.is_object() || !v.contains("dtype") || !v["dtype"].is_string() || !v.contains("shape") ||
      !v["shape"].is_array()) {
    return Error(absl::StrCat(where, ": needs dtype and shape"));
  }
  absl::StatusOr<DType> dt = ParseDType(v["dtype"].get<std::string>());
  if (!dt.ok()) return Error(absl::StrCat(where, ": ", dt.status().message()));
  dtype = *dt;
  shape.clear();
  for (const nlohmann::json& d : v["shape"]) {
    if (!d.is_number_integer()) return Error(absl::StrCat(where, ": shape is not integers"));
    shape.push_back(d.get<int64_t>());
  }
  if (absl::StatusOr<size_t> n = TensorBytes(dtype, shape); !n.ok()) {
    return Error(absl::StrCat(where, ": ", n.status().message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorEntry> ManifestParser::Entry(const nlohmann::json& v,
                                                  const std::string& key) const {
  const std::string where = absl::StrCat("key '", key, "'");
  if (!IsValidStateKey(key)) return Error(absl::StrCat(where, " is malformed"));
  TensorEntry e;
  e.key = key;
  if (absl::Status st = TypeAndShape(v, where, e.dtype, e.shape); !st.ok()) return st;
  absl::StatusOr<std::pair<uint64_t, uint64_t>> off = Pair(v, "data_offsets", where);
  if (!off.ok()) return off.status();
  e.begin = off->first;
  e.end = off->second;
  if (e.end - e.begin != *TensorBytes(e.dtype, e.shape)) {
    return Error(absl::StrCat(where, ": data_offsets [", e.begin, ",", e.end, "] do not hold ",
                              DTypeName(e.dtype), " ", ShapeString(e.shape)));
  }
  absl::StatusOr<uint64_t> h = Hex(v, "xxh3", where);
  if (!h.ok()) return h.status();
  e.xxh3 = *h;
  return e;
}

CheckpointInfo ManifestFields::Info(const std::string& path, int version, int64_t bytes) const {
  CheckpointInfo i;
  i.step = step;
  i.path = path;
  i.world_size = world_size;
  i.format_version = version;
  i.library_version = library_version;
  i.job_id = job_id;
  i.bytes = bytes;
  i.created_unix_ms = created_unix_ms;
  i.metadata = metadata;
  return i;
}

absl::StatusOr<int> ManifestParser::FormatVersion(const nlohmann::json& j) const {
  if (!j.contains("format") || j["format"] != kManifestFormat) {
    return Error("not an omni checkpoint manifest (format is not \"omni.checkpoint\")");
  }
  if (!j.contains("version") || !j["version"].is_number_integer()) {
    return Error("no format version");
  }
  return j["version"].get<int>();
}

}  // namespace omni::ckpt
