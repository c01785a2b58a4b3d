#include "ckpt/rank_manifest.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/strings.h"
#include "omni/hash.h"
#include "omni/version.h"

namespace omni::ckpt::rank {
namespace {

using internal::Sv;
using nlohmann::json;
using nlohmann::ordered_json;

// `shard` < 0: none (fragments); with_key: the key inside the shard.
ordered_json EntryJson(const TensorEntry& e, int shard = -1, bool with_key = false) {
  ordered_json j;
  if (shard >= 0) j["shard"] = shard;
  if (with_key) j["key"] = e.key;
  j["dtype"] = DTypeName(e.dtype);
  j["shape"] = e.shape;
  j["data_offsets"] = {e.begin, e.end};
  j["xxh3"] = HexDigest(e.xxh3);
  return j;
}

ordered_json RecordJson(const ShardRecord& r) {
  ordered_json j;
  j["rank"] = r.rank;
  j["file"] = r.file;
  j["bytes"] = r.bytes;
  j["header_bytes"] = r.header_bytes;
  j["header_xxh3"] = HexDigest(r.header_xxh3);
  j["xxh3"] = HexDigest(r.xxh3);
  return j;
}

// An object written field by field, in order (ordered_json looks keys up
// linearly, too slow for tens of thousands of entries).
class ObjectText {
 public:
  void Add(const std::string& key, const std::string& value_json) {
    absl::StrAppend(&text_, text_.empty() ? "{\n" : ",\n", indent_, Quote(key), ": ", value_json);
  }
  template <typename T>
  void Value(const std::string& key, const T& value) {
    Add(key, ordered_json(value).dump(-1, ' ', false, ordered_json::error_handler_t::replace));
  }
  std::string Close(const std::string& outer_indent = "") {
    return text_.empty() ? "{}" : absl::StrCat(text_, "\n", outer_indent, "}");
  }
  explicit ObjectText(std::string indent = " ") : indent_(std::move(indent)) {}

 private:
  static std::string Quote(const std::string& s) {
    return ordered_json(s).dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  }
  std::string indent_;
  std::string text_;
};

std::string Compact(const ordered_json& j) {
  return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

// Parsing: every structural problem is DataLoss naming `path` (and the key);
// json type errors are caught and reported the same way.
class Parser : public ckpt::ManifestParser {
 public:
  using ManifestParser::ManifestParser;
  absl::StatusOr<ShardRecord> Record(const json& v, std::string_view what) const {
    if (!v.is_object() || !v.contains("rank") || !v["rank"].is_number_integer() ||
        !v.contains("file") || !v["file"].is_string()) {
      return Error(absl::StrCat(Sv(what), ": needs rank and file"));
    }
    ShardRecord r;
    r.rank = v["rank"].get<int>();
    r.file = v["file"].get<std::string>();
    if (r.file != ShardFileName(r.rank)) {
      return Error(absl::StrCat(Sv(what), ": file '", r.file, "' is not ", ShardFileName(r.rank)));
    }
    absl::StatusOr<uint64_t> bytes = U64(v, "bytes", what);
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<uint64_t> hb = U64(v, "header_bytes", what);
    if (!hb.ok()) return hb.status();
    absl::StatusOr<uint64_t> hh = Hex(v, "header_xxh3", what);
    if (!hh.ok()) return hh.status();
    absl::StatusOr<uint64_t> dh = Hex(v, "xxh3", what);
    if (!dh.ok()) return dh.status();
    r.bytes = *bytes;
    r.header_bytes = *hb;
    r.header_xxh3 = *hh;
    r.xxh3 = *dh;
    if (r.header_bytes < 16 || r.header_bytes % 8 != 0 || r.header_bytes > r.bytes) {
      return Error(absl::StrCat(Sv(what), ": header_bytes ", r.header_bytes, " is impossible"));
    }
    return r;
  }
  // Entries of one shard: back to back, filling its data section, and
  // matching the shard's digest.
  absl::Status CheckLayout(std::vector<TensorEntry>& entries, const ShardRecord& r) const {
    std::sort(entries.begin(), entries.end(), ckpt::ByOffset);
    uint64_t pos = 0;
    for (const TensorEntry& e : entries) {
      if (e.begin != pos) {
        return Error(
            absl::StrCat(r.file, ": key '", e.key, "' starts at ", e.begin, ", expected ", pos));
      }
      pos = e.end;
    }
    if (pos != r.bytes - r.header_bytes) {
      return Error(absl::StrCat(r.file, ": entries hold ", pos, " bytes, the data section ",
                                r.bytes - r.header_bytes));
    }
    if (ckpt::EntriesDigest(entries) != r.xxh3) {
      return Error(absl::StrCat(r.file, ": xxh3 of the entries does not match the shard's"));
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::string RankPrefix(int rank) {
  char buf[24];  // "rank-" + up to 11 characters of an int + "."
  std::snprintf(buf, sizeof(buf), "rank-%05d.", rank);
  return buf;
}

std::string ShardFileName(int rank) { return RankPrefix(rank) + "safetensors"; }
std::string FragmentName(int rank) { return RankPrefix(rank) + "json"; }

std::string ManifestJson(const Manifest& m) {
  ObjectText top;
  top.Value("format", kFormat);
  top.Value("version", m.version);
  top.Value("step", m.step);
  top.Value("world_size", m.world_size);
  top.Value("library_version", m.library_version);
  top.Value("job_id", m.job_id);
  top.Value("created_unix_ms", m.created_unix_ms);
  ObjectText md("  ");
  for (const auto& [k, v] : m.metadata) md.Value(k, v);
  top.Add("metadata", md.Close(" "));
  std::string shards = "[";
  for (const ShardRecord& r : m.shards) {
    absl::StrAppend(&shards, shards.size() > 1 ? ",\n  " : "\n  ", Compact(RecordJson(r)));
  }
  top.Add("shards", shards + "\n ]");
  ObjectText entries("  ");
  for (size_t s = 0; s < m.entries.size(); ++s) {
    for (const TensorEntry& e : m.entries[s]) {
      entries.Add(m.world_size > 1 ? absl::StrCat(s, ":", e.key) : e.key,
                  Compact(EntryJson(e, static_cast<int>(s), m.world_size > 1)));
    }
  }
  top.Add("entries", entries.Close(" "));
  return top.Close() + "\n";
}

absl::StatusOr<Manifest> ParseManifest(const std::string& text, const std::string& step_dir) {
  const std::string path = Join(step_dir, kManifest);
  Parser p(path);
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return p.Error("not valid JSON");
  Manifest m;
  m.dir = step_dir;
  try {
    absl::StatusOr<int> version = p.FormatVersion(j);
    if (!version.ok()) return version.status();
    m.version = *version;
    if (j.contains("layout") && j["layout"] == "job") {  // omni/job_checkpoint.h
      return absl::FailedPreconditionError(
          absl::StrCat(step_dir,
                       ": a job-level checkpoint of an elastic job (one directory shared by its "
                       "replicas); restore it through omni::Runtime with a store, or "
                       "omni::JobCheckpointManager"));
    }
    if (m.version > kVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          step_dir, ": checkpoint format version ", m.version, " is newer than this library (omni ",
          Version(), " reads version ", kVersion, "); upgrade omni to read it"));
    }
    if (m.version < 1) return p.Error(absl::StrCat("format version ", m.version, " is invalid"));
    if (std::optional<std::string> e = ckpt::ReadManifestFields(j, m)) return p.Error(*e);
    if (!j.contains("shards") || !j["shards"].is_array() ||
        j["shards"].size() != static_cast<size_t>(m.world_size)) {
      return p.Error(absl::StrCat("needs one shard per rank (world_size ", m.world_size, ")"));
    }
    for (size_t i = 0; i < j["shards"].size(); ++i) {
      absl::StatusOr<ShardRecord> r = p.Record(j["shards"][i], absl::StrCat("shard ", i));
      if (!r.ok()) return r.status();
      if (r->rank != static_cast<int>(i)) {
        return p.Error(absl::StrCat("shard ", i, " has rank ", r->rank));
      }
      m.shards.push_back(*r);
    }
    if (!j.contains("entries") || !j["entries"].is_object()) return p.Error("no entries");
    m.entries.resize(m.shards.size());
    std::vector<std::unordered_set<std::string>> seen(m.shards.size());
    for (const auto& [name, v] : j["entries"].items()) {
      if (!v.is_object() || !v.contains("shard") || !v["shard"].is_number_unsigned() ||
          v["shard"].get<uint64_t>() >= m.shards.size()) {
        return p.Error(absl::StrCat("entry '", name, "': no valid shard"));
      }
      const size_t s = v["shard"].get<size_t>();
      std::string key = name;
      if (v.contains("key")) {
        if (!v["key"].is_string()) return p.Error(absl::StrCat("entry '", name, "': bad key"));
        key = v["key"].get<std::string>();
      }
      absl::StatusOr<TensorEntry> e = p.Entry(v, key);
      if (!e.ok()) return e.status();
      if (!seen[s].insert(key).second) {
        return p.Error(absl::StrCat("key '", key, "' appears twice in shard ", s));
      }
      m.entries[s].push_back(*std::move(e));
    }
    for (size_t s = 0; s < m.shards.size(); ++s) {
      if (absl::Status st = p.CheckLayout(m.entries[s], m.shards[s]); !st.ok()) return st;
    }
  } catch (const json::exception& ex) {
    return p.Error(absl::StrCat("malformed: ", ex.what()));
  }
  return m;
}

std::string FragmentJson(int64_t step, const ShardRecord& r, const std::vector<TensorEntry>& es) {
  ObjectText top;
  top.Value("format", kFragmentFormat);
  top.Value("version", kVersion);
  top.Value("step", step);
  top.Add("shard", Compact(RecordJson(r)));
  ObjectText entries("  ");
  for (const TensorEntry& e : es) entries.Add(e.key, Compact(EntryJson(e)));
  top.Add("entries", entries.Close(" "));
  return top.Close() + "\n";
}

absl::Status ParseFragment(const std::string& text, const std::string& path, int64_t step, int rank,
                           ShardRecord& rec, std::vector<TensorEntry>& entries) {
  Parser p(path);
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return p.Error("not valid JSON");
  try {
    if (!j.contains("format") || j["format"] != kFragmentFormat || !j.contains("version") ||
        j["version"] != kVersion) {
      return p.Error("not a version 1 checkpoint fragment");
    }
    if (!j.contains("step") || j["step"] != step) {
      return p.Error(absl::StrCat("is not for step ", step));
    }
    if (!j.contains("shard") || !j.contains("entries") || !j["entries"].is_object()) {
      return p.Error("needs shard and entries");
    }
    absl::StatusOr<ShardRecord> r = p.Record(j["shard"], "shard");
    if (!r.ok()) return r.status();
    if (r->rank != rank) return p.Error(absl::StrCat("is for rank ", r->rank));
    rec = *r;
    entries.clear();
    for (const auto& [key, v] : j["entries"].items()) {
      absl::StatusOr<TensorEntry> e = p.Entry(v, key);
      if (!e.ok()) return e.status();
      entries.push_back(*std::move(e));
    }
    return p.CheckLayout(entries, rec);
  } catch (const json::exception& ex) {
    return p.Error(absl::StrCat("malformed: ", ex.what()));
  }
}

}  // namespace omni::ckpt::rank
