#include "ckpt/job_manifest.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/strings.h"
#include "omni/hash.h"

namespace omni::ckpt {
namespace {

using internal::Sv;
using nlohmann::json;

constexpr const char* kFormat = kManifestFormat;
constexpr const char* kFragmentFormat = "omni.checkpoint.job-part";

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json EntryJson(const TensorEntry& e) {
  return json{{"dtype", DTypeName(e.dtype)},
              {"shape", e.shape},
              {"data_offsets", {e.begin, e.end}},
              {"xxh3", HexDigest(e.xxh3)}};
}

json PieceJson(const JobPiece& p, bool with_part) {
  json j;
  if (with_part) j["part"] = p.part;
  j["range"] = {p.begin, p.end};
  j["data_offsets"] = {p.data_begin, p.data_end};
  j["xxh3"] = HexDigest(p.xxh3);
  return j;
}

json PartJson(const JobPart& p) {
  return json{{"rank", p.rank},
              {"replica_id", p.replica_id},
              {"file", p.file},
              {"bytes", p.bytes},
              {"header_bytes", p.header_bytes},
              {"header_xxh3", HexDigest(p.header_xxh3)},
              {"xxh3", HexDigest(p.xxh3)},
              {"replicated_bytes", p.replicated_bytes},
              {"replica_bytes", p.replica_bytes}};
}

// Every structural problem is DataLoss naming the file (and the key).
class Parser : public ManifestParser {
 public:
  using ManifestParser::ManifestParser;
  absl::StatusOr<JobPart> Part(const json& v, std::string_view what) const {
    if (!v.is_object() || !v.contains("rank") || !v["rank"].is_number_unsigned() ||
        !v.contains("file") || !v["file"].is_string()) {
      return Error(absl::StrCat(Sv(what), ": needs rank and file"));
    }
    JobPart p;
    p.rank = v["rank"].get<int>();
    p.file = v["file"].get<std::string>();
    if (p.file != PartFileName(p.rank)) {
      return Error(absl::StrCat(Sv(what), ": file '", p.file, "' is not ", PartFileName(p.rank)));
    }
    if (v.contains("replica_id") && v["replica_id"].is_string()) {
      p.replica_id = v["replica_id"].get<std::string>();
    }
    for (auto [field, dst] : {std::pair<const char*, uint64_t*>{"bytes", &p.bytes},
                              {"header_bytes", &p.header_bytes},
                              {"replicated_bytes", &p.replicated_bytes},
                              {"replica_bytes", &p.replica_bytes}}) {
      absl::StatusOr<uint64_t> n = U64(v, field, what);
      if (!n.ok()) return n.status();
      *dst = *n;
    }
    absl::StatusOr<uint64_t> hh = Hex(v, "header_xxh3", what);
    if (!hh.ok()) return hh.status();
    absl::StatusOr<uint64_t> dh = Hex(v, "xxh3", what);
    if (!dh.ok()) return dh.status();
    p.header_xxh3 = *hh;
    p.xxh3 = *dh;
    if (p.header_bytes < 16 || p.header_bytes % 8 != 0 || p.header_bytes > p.bytes) {
      return Error(absl::StrCat(Sv(what), ": header_bytes ", p.header_bytes, " is impossible"));
    }
    return p;
  }
  absl::StatusOr<JobPiece> Piece(const json& v, const std::string& where, bool with_part) const {
    if (!v.is_object()) return Error(absl::StrCat(where, ": a piece is not an object"));
    JobPiece p;
    if (with_part) {
      absl::StatusOr<uint64_t> part = U64(v, "part", where);
      if (!part.ok()) return part.status();
      if (*part > 99999) return Error(absl::StrCat(where, ": part ", *part, " is impossible"));
      p.part = static_cast<int>(*part);
    }
    absl::StatusOr<std::pair<uint64_t, uint64_t>> range = Pair(v, "range", where);
    if (!range.ok()) return range.status();
    absl::StatusOr<std::pair<uint64_t, uint64_t>> off = Pair(v, "data_offsets", where);
    if (!off.ok()) return off.status();
    p.begin = range->first;
    p.end = range->second;
    p.data_begin = off->first;
    p.data_end = off->second;
    if (p.end - p.begin != p.data_end - p.data_begin) {
      return Error(absl::StrCat(where, ": range and data_offsets differ in length"));
    }
    absl::StatusOr<uint64_t> h = Hex(v, "xxh3", where);
    if (!h.ok()) return h.status();
    p.xxh3 = *h;
    return p;
  }
  // A part's entries: back to back, filling its data section, matching its
  // digest.
  absl::Status CheckLayout(std::vector<TensorEntry> entries, const JobPart& p) const {
    std::sort(entries.begin(), entries.end(), ByOffset);
    uint64_t pos = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      const TensorEntry& e = entries[i];
      if (i > 0 && entries[i - 1].key == e.key) {
        return Error(absl::StrCat(p.file, ": key '", e.key, "' appears twice"));
      }
      if (e.begin != pos) {
        return Error(
            absl::StrCat(p.file, ": key '", e.key, "' starts at ", e.begin, ", expected ", pos));
      }
      pos = e.end;
    }
    if (pos != p.bytes - p.header_bytes) {
      return Error(absl::StrCat(p.file, ": entries hold ", pos, " bytes, the data section ",
                                p.bytes - p.header_bytes));
    }
    if (EntriesDigest(entries) != p.xxh3) {
      return Error(absl::StrCat(p.file, ": xxh3 of the entries does not match the part's"));
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::string PartFileName(int rank) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "part-%05d.safetensors", rank);
  return buf;
}

std::string PartFragmentName(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "part-%05d.json", rank);
  return buf;
}

std::vector<int64_t> PieceShape(const JobTensor& t, const JobPiece& p) {
  if (p.begin == 0 && p.end == t.nbytes) return t.shape;
  return {static_cast<int64_t>((p.end - p.begin) / DTypeSize(t.dtype))};
}

std::vector<TensorEntry> JobManifest::PartEntries(int p) const {
  std::vector<TensorEntry> out;
  for (const JobTensor& t : replicated) {
    for (const JobPiece& piece : t.pieces) {
      if (piece.part != p) continue;
      TensorEntry e;
      e.key = t.key;
      e.dtype = t.dtype;
      e.shape = PieceShape(t, piece);
      e.begin = piece.data_begin;
      e.end = piece.data_end;
      e.xxh3 = piece.xxh3;
      out.push_back(std::move(e));
    }
  }
  if (p >= 0 && static_cast<size_t>(p) < per_replica.size()) {
    out.insert(out.end(), per_replica[p].begin(), per_replica[p].end());
  }
  std::sort(out.begin(), out.end(), ByOffset);
  return out;
}

int64_t JobManifest::TotalBytes() const {
  int64_t n = 0;
  for (const JobPart& p : parts) n += static_cast<int64_t>(p.bytes);
  return n;
}

CheckpointInfo JobManifest::Info() const {
  return ManifestFields::Info(dir, version, TotalBytes());
}

std::string JobManifestJson(const JobManifest& m) {
  // Written by hand at the top level so that the fields keep this order.
  json parts = json::array();
  for (const JobPart& p : m.parts) parts.push_back(PartJson(p));
  json replicated = json::object();
  for (const JobTensor& t : m.replicated) {
    json pieces = json::array();
    for (const JobPiece& p : t.pieces) pieces.push_back(PieceJson(p, true));
    replicated[t.key] = json{{"dtype", DTypeName(t.dtype)}, {"shape", t.shape}, {"pieces", pieces}};
  }
  json per_replica = json::array();
  for (const auto& entries : m.per_replica) {
    json o = json::object();
    for (const TensorEntry& e : entries) o[e.key] = EntryJson(e);
    per_replica.push_back(std::move(o));
  }
  json md = json::object();
  for (const auto& [k, v] : m.metadata) md[k] = v;
  std::string out = "{\n";
  const auto add = [&out](const char* key, const json& v, bool last = false) {
    absl::StrAppend(&out, " \"", key, "\": ", Dump(v), last ? "\n" : ",\n");
  };
  add("format", kFormat);
  add("version", m.version);
  add("layout", kJobLayout);
  add("step", m.step);
  add("world_size", m.world_size);
  add("library_version", m.library_version);
  add("job_id", m.job_id);
  add("created_unix_ms", m.created_unix_ms);
  add("token", HexDigest(m.token));
  add("metadata", md);
  out += " \"parts\": [";
  for (size_t i = 0; i < m.parts.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "\n  " : ",\n  ", Dump(parts[i]));
  }
  out += "\n ],\n \"replicated\": {";
  bool first = true;
  for (const auto& [k, v] : replicated.items()) {
    absl::StrAppend(&out, first ? "\n  " : ",\n  ", Dump(k), ": ", Dump(v));
    first = false;
  }
  out += "\n },\n";
  add("per_replica", per_replica, /*last=*/true);
  out += "}\n";
  return out;
}

bool DeclaresJobLayout(const std::string& text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("layout") && j["layout"] == kJobLayout;
}

absl::StatusOr<JobManifest> ParseJobManifest(const std::string& text, const std::string& step_dir) {
  const std::string path = step_dir + "/manifest.json";
  Parser p(path);
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return p.Error("not valid JSON");
  JobManifest m;
  m.dir = step_dir;
  try {
    absl::StatusOr<int> version = p.FormatVersion(j);
    if (!version.ok()) return version.status();
    m.version = *version;
    if (m.version > kJobVersion) {
      return absl::FailedPreconditionError(
          absl::StrCat(step_dir, ": checkpoint format version ", m.version,
                       " is newer than this library reads (", kJobVersion, "); upgrade omni"));
    }
    if (!j.contains("layout") || j["layout"] != kJobLayout || m.version != kJobVersion) {
      return absl::FailedPreconditionError(
          absl::StrCat(step_dir,
                       ": not a job-level checkpoint (written by a job without an elastic group, "
                       "one directory per rank); restore it with omni::CheckpointManager"));
    }
    if (std::optional<std::string> e = ReadManifestFields(j, m)) return p.Error(*e);
    absl::StatusOr<uint64_t> token = p.Hex(j, "token", "manifest");
    if (!token.ok()) return token.status();
    m.token = *token;
    if (!j.contains("parts") || !j["parts"].is_array() ||
        j["parts"].size() != static_cast<size_t>(m.world_size)) {
      return p.Error(absl::StrCat("needs one part per replica (world_size ", m.world_size, ")"));
    }
    for (size_t i = 0; i < j["parts"].size(); ++i) {
      absl::StatusOr<JobPart> part = p.Part(j["parts"][i], absl::StrCat("part ", i));
      if (!part.ok()) return part.status();
      if (part->rank != static_cast<int>(i)) {
        return p.Error(absl::StrCat("part ", i, " has rank ", part->rank));
      }
      m.parts.push_back(*std::move(part));
    }
    if (!j.contains("replicated") || !j["replicated"].is_object()) {
      return p.Error("no replicated entries");
    }
    std::set<std::string> keys;
    for (const auto& [key, v] : j["replicated"].items()) {
      const std::string where = absl::StrCat("key '", key, "'");
      if (!IsValidStateKey(key)) return p.Error(absl::StrCat(where, " is malformed"));
      JobTensor t;
      t.key = key;
      if (auto st = p.TypeAndShape(v, where, t.dtype, t.shape); !st.ok()) return st;
      t.nbytes = *TensorBytes(t.dtype, t.shape);
      if (!v.contains("pieces") || !v["pieces"].is_array() || v["pieces"].empty()) {
        return p.Error(absl::StrCat(where, ": no pieces"));
      }
      uint64_t pos = 0;
      for (const json& pj : v["pieces"]) {
        absl::StatusOr<JobPiece> piece = p.Piece(pj, where, true);
        if (!piece.ok()) return piece.status();
        if (piece->part >= m.world_size) {
          return p.Error(
              absl::StrCat(where, ": piece in part ", piece->part, " of ", m.world_size));
        }
        if (piece->begin != pos || (piece->end - piece->begin) % DTypeSize(t.dtype) != 0) {
          return p.Error(absl::StrCat(where, ": pieces do not tile the tensor at byte ", pos));
        }
        pos = piece->end;
        t.pieces.push_back(*piece);
      }
      if (pos != t.nbytes) {
        return p.Error(absl::StrCat(where, ": pieces hold ", pos, " of its ", t.nbytes, " bytes"));
      }
      keys.insert(key);
      m.replicated.push_back(std::move(t));
    }
    if (!j.contains("per_replica") || !j["per_replica"].is_array() ||
        j["per_replica"].size() != static_cast<size_t>(m.world_size)) {
      return p.Error("needs one per_replica object per part");
    }
    for (const json& o : j["per_replica"]) {
      if (!o.is_object()) return p.Error("per_replica holds a non-object");
      std::vector<TensorEntry> entries;
      for (const auto& [key, v] : o.items()) {
        if (keys.count(key) != 0) {
          return p.Error(absl::StrCat("key '", key, "' is both replicated and per replica"));
        }
        absl::StatusOr<TensorEntry> e = p.Entry(v, key);
        if (!e.ok()) return e.status();
        entries.push_back(*std::move(e));
      }
      m.per_replica.push_back(std::move(entries));
    }
    for (int r = 0; r < m.world_size; ++r) {
      if (auto st = p.CheckLayout(m.PartEntries(r), m.parts[r]); !st.ok()) return st;
    }
  } catch (const json::exception& ex) {
    return p.Error(absl::StrCat("malformed: ", ex.what()));
  }
  return m;
}

uint64_t PlanDigest(const std::vector<PlanItem>& items) {
  Xxh3 h;
  for (const PlanItem& i : items) {
    const std::string line =
        absl::StrCat(i.key, "\t", DTypeName(i.dtype), "\t", ShapeString(i.shape), "\n");
    h.Update(line.data(), line.size());
  }
  return h.Digest();
}

std::vector<uint64_t> PlanCuts(const std::vector<PlanItem>& items, int size) {
  uint64_t total = 0;
  for (const PlanItem& i : items) total += i.nbytes;
  std::vector<uint64_t> cuts(static_cast<size_t>(size) + 1, total);
  cuts[0] = 0;
  for (int r = 1; r < size; ++r) {
    // The ideal cut, moved down to an element boundary of the tensor it
    // falls in (never below the previous cut).
    const auto n = static_cast<uint64_t>(size);
    const auto k = static_cast<uint64_t>(r);
    const uint64_t ideal = total / n * k + total % n * k / n;  // floor(total * k / n), no overflow
    uint64_t start = 0;
    uint64_t cut = ideal;
    for (const PlanItem& i : items) {
      if (ideal < start + i.nbytes) {
        const uint64_t el = DTypeSize(i.dtype);
        cut = start + (ideal - start) / el * el;
        break;
      }
      start += i.nbytes;
    }
    cuts[r] = std::max(cut, cuts[r - 1]);
  }
  return cuts;
}

std::string JobFragmentJson(const JobFragment& f) {
  json pieces = json::object();
  for (const auto& [k, p] : f.pieces) pieces[k] = PieceJson(p, false);
  json per = json::object();
  for (const TensorEntry& e : f.per_replica) per[e.key] = EntryJson(e);
  const json j{
      {"format", kFragmentFormat},   {"version", kJobVersion}, {"step", f.step},
      {"token", HexDigest(f.token)}, {"size", f.size},         {"plan", HexDigest(f.plan_digest)},
      {"part", PartJson(f.part)},    {"pieces", pieces},       {"per_replica", per}};
  return Dump(j) + "\n";
}

absl::StatusOr<JobFragment> ParseJobFragment(const std::string& text, const std::string& path) {
  Parser p(path);
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return p.Error("not valid JSON");
  JobFragment f;
  try {
    if (!j.contains("format") || j["format"] != kFragmentFormat || !j.contains("version") ||
        j["version"] != kJobVersion) {
      return p.Error("not a version 2 job checkpoint part description");
    }
    absl::StatusOr<uint64_t> step = p.U64(j, "step", "fragment");
    if (!step.ok()) return step.status();
    f.step = static_cast<int64_t>(*step);
    absl::StatusOr<uint64_t> size = p.U64(j, "size", "fragment");
    if (!size.ok()) return size.status();
    f.size = static_cast<int>(*size);
    absl::StatusOr<uint64_t> token = p.Hex(j, "token", "fragment");
    if (!token.ok()) return token.status();
    f.token = *token;
    absl::StatusOr<uint64_t> plan = p.Hex(j, "plan", "fragment");
    if (!plan.ok()) return plan.status();
    f.plan_digest = *plan;
    if (!j.contains("part")) return p.Error("no part");
    absl::StatusOr<JobPart> part = p.Part(j["part"], "part");
    if (!part.ok()) return part.status();
    f.part = *std::move(part);
    if (!j.contains("pieces") || !j["pieces"].is_object() || !j.contains("per_replica") ||
        !j["per_replica"].is_object()) {
      return p.Error("needs pieces and per_replica");
    }
    for (const auto& [k, v] : j["pieces"].items()) {
      absl::StatusOr<JobPiece> piece = p.Piece(v, absl::StrCat("key '", k, "'"), false);
      if (!piece.ok()) return piece.status();
      piece->part = f.part.rank;
      f.pieces[k] = *piece;
    }
    for (const auto& [k, v] : j["per_replica"].items()) {
      absl::StatusOr<TensorEntry> e = p.Entry(v, k);
      if (!e.ok()) return e.status();
      f.per_replica.push_back(*std::move(e));
    }
  } catch (const json::exception& ex) {
    return p.Error(absl::StrCat("malformed: ", ex.what()));
  }
  return f;
}

}  // namespace omni::ckpt
