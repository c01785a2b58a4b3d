#include "omni/step_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "runtime/output_rotation.h"

namespace omni {

using internal::ErrnoStatus;
using nlohmann::json;

namespace {

json EventJson(const PeriodicEvent& e) {
  json j = {{"every_steps", e.every_steps}, {"offset", e.offset}, {"expected_ns", e.expected_ns}};
  if (e.every_ns > 0) j["every_ns"] = e.every_ns;  // only then: older readers read the rest
  if (e.wall_lag_steps > 0) j["wall_lag_steps"] = e.wall_lag_steps;
  return j;
}

json PhaseJson(const PhaseCatalog& c, int id) {
  return {{"type", "phase"},
          {"id", id},
          {"name", c.name(static_cast<PhaseId>(id))},
          {"idle", std::string(IdleKindName(c.idle_kind(static_cast<PhaseId>(id))))}};
}

}  // namespace

StepLogWriter::StepLogWriter(Private, std::FILE* file, std::string path, int phases_announced)
    : file_(file), path_(std::move(path)), phases_announced_(phases_announced) {}

StepLogWriter::~StepLogWriter() { Close().IgnoreError(); }

absl::StatusOr<std::unique_ptr<StepLogWriter>> StepLogWriter::Open(const std::string& path,
                                                                   const StepLogHeader& header,
                                                                   bool keep_previous) {
  std::string previous;
  if (keep_previous) {
    absl::StatusOr<std::string> moved = internal::MoveAside(path);
    if (!moved.ok()) return moved.status();
    previous = *std::move(moved);
  }
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return ErrnoStatus(errno, absl::StrCat("cannot open step log ", path));
  auto w = std::make_unique<StepLogWriter>(Private{}, f, path, header.phases.size());
  w->previous_path_ = std::move(previous);
  json h;
  h["type"] = "header";
  h["schema"] = "omni.steplog";
  h["version"] = StepLogHeader::kSchemaVersion;
  h["source"] = header.source;
  h["clock"] = "CLOCK_MONOTONIC";
  json phases = json::array();
  for (int i = 0; i < header.phases.size(); ++i) {
    json p = PhaseJson(header.phases, i);
    p.erase("type");
    phases.push_back(std::move(p));
  }
  h["phases"] = std::move(phases);
  h["events"] = {{"checkpoint", EventJson(header.checkpoint)},
                 {"eval", EventJson(header.eval)},
                 {"pipeline",
                  {{"stages", header.pipeline.stages},
                   {"micro_batches", header.pipeline.micro_batches},
                   {"stage", header.pipeline.stage},
                   {"backward_over_forward", header.pipeline.backward_over_forward}}}};
  const std::string line = h.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f) != line.size()) {
    return ErrnoStatus(errno, absl::StrCat("cannot write step log ", path));
  }
  return w;
}

absl::Status StepLogWriter::Append(const StepRecord& rec, const PhaseCatalog& catalog,
                                   bool warmup) {
  if (file_ == nullptr) return absl::FailedPreconditionError("step log is closed");
  line_.clear();
  for (; phases_announced_ < catalog.size(); ++phases_announced_) {
    absl::StrAppend(&line_, PhaseJson(catalog, phases_announced_).dump(), "\n");
  }
  absl::StrAppend(&line_, "{\"type\":\"step\",\"step\":", rec.step, ",\"start_ns\":", rec.start_ns,
                  ",\"end_ns\":", rec.end_ns, ",\"kind\":\"", StepKindName(rec.kind()),
                  "\",\"warmup\":", warmup ? "true" : "false");
  if (rec.spans_truncated) absl::StrAppend(&line_, ",\"spans_truncated\":true");
  absl::StrAppend(&line_, ",\"spans\":[");
  for (int i = 0; i < rec.num_spans; ++i) {
    const PhaseSpan& s = rec.spans[i];
    absl::StrAppend(&line_, i ? "," : "", "{\"phase\":\"", catalog.name(s.phase),
                    "\",\"start_ns\":", s.start_ns, ",\"end_ns\":", s.end_ns,
                    ",\"depth\":", static_cast<int>(s.depth), "}");
  }
  absl::StrAppend(&line_, "]}\n");
  if (std::fwrite(line_.data(), 1, line_.size(), file_) != line_.size()) {
    return ErrnoStatus(errno, absl::StrCat("cannot write step log ", path_));
  }
  return absl::OkStatus();
}

absl::Status StepLogWriter::Flush() {
  if (file_ != nullptr && std::fflush(file_) != 0) {
    return ErrnoStatus(errno, absl::StrCat("cannot write step log ", path_));
  }
  return absl::OkStatus();
}

absl::Status StepLogWriter::Close() {
  if (file_ == nullptr) return absl::OkStatus();
  absl::Status st;
  if (std::fflush(file_) != 0) {
    st = ErrnoStatus(errno, absl::StrCat("cannot write step log ", path_));
  } else if (::fsync(fileno(file_)) != 0) {
    st = ErrnoStatus(errno, absl::StrCat("cannot fsync step log ", path_));
  }
  if (std::fclose(file_) != 0 && st.ok()) {
    st = ErrnoStatus(errno, absl::StrCat("cannot close step log ", path_));
  }
  file_ = nullptr;
  return st;
}

// ------------------------------------------------------------------ reading

namespace {

absl::StatusOr<int64_t> GetInt(const json& o, const char* key, const std::string& where) {
  auto it = o.find(key);
  if (it == o.end() || !it->is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field '", key, "' missing or not an integer"));
  }
  return it->get<int64_t>();
}

absl::Status ReadEvent(const json& o, PeriodicEvent& e, const std::string& where) {
  if (!o.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, ": not an object"));
  for (auto [key, dst] : {std::pair<const char*, int64_t*>{"every_steps", &e.every_steps},
                          {"offset", &e.offset},
                          {"expected_ns", &e.expected_ns}}) {
    auto v = GetInt(o, key, where);
    if (!v.ok()) return v.status();
    *dst = *v;
  }
  // An event by wall time, and its lag (optional).
  for (auto [key, dst] : {std::pair<const char*, int64_t*>{"every_ns", &e.every_ns},
                          {"wall_lag_steps", &e.wall_lag_steps}}) {
    *dst = 0;
    if (!o.contains(key)) continue;
    auto v = GetInt(o, key, where);
    if (!v.ok()) return v.status();
    *dst = *v;
  }
  return absl::OkStatus();
}

absl::Status AddPhase(PhaseCatalog& cat, const json& p, const std::string& where) {
  auto id = GetInt(p, "id", where);
  if (!id.ok()) return id.status();
  if (!p.contains("name") || !p["name"].is_string() || !p.contains("idle") ||
      !p["idle"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": phase needs 'name' and 'idle'"));
  }
  auto kind = ParseIdleKind(p["idle"].get<std::string>());
  if (!kind.ok())
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", kind.status().message()));
  const std::string name = p["name"].get<std::string>();
  if (*id < cat.size()) {
    if (cat.name(static_cast<PhaseId>(*id)) != name ||
        cat.idle_kind(static_cast<PhaseId>(*id)) != *kind) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": phase ", *id, " '", name,
                                                     "' does not match the built-in phase '",
                                                     cat.name(static_cast<PhaseId>(*id)), "'"));
    }
    return absl::OkStatus();
  }
  if (*id != cat.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": phase id ", *id, " out of order (expected ", cat.size(), ")"));
  }
  auto got = cat.Register(name, *kind);
  if (!got.ok())
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", got.status().message()));
  return absl::OkStatus();
}

// One line of the log (header, phase or step) into `log`.
absl::Status ParseLine(const json& j, const std::string& where, bool& have_header, StepLog& log) {
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
  if (j.contains("type") && !j["type"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": field 'type' is not a string"));
  }
  const std::string type = j.value("type", "");
  if (!have_header && type == "step") {
    // No header (a log written by hand or converted from another tool): the
    // built-in phases, no declared events; a phase of another name is an
    // error naming it (ValidateStepRecord below).
    have_header = true;
  }
  if (!have_header) {
    if (type != "header" || !j.contains("schema") || j["schema"] != "omni.steplog") {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": first line is neither an omni.steplog header nor a step"));
    }
    auto v = GetInt(j, "version", where);
    if (!v.ok()) return v.status();
    if (*v > StepLogHeader::kSchemaVersion) {
      return absl::FailedPreconditionError(absl::StrCat(where, ": step log version ", *v,
                                                        " is newer than supported version ",
                                                        StepLogHeader::kSchemaVersion));
    }
    log.header.version = static_cast<int>(*v);
    if (j.contains("source") && !j["source"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": field 'source' is not a string"));
    }
    log.header.source = j.value("source", "");
    if (!j.contains("phases") || !j["phases"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": header has no 'phases' array"));
    }
    for (const json& p : j["phases"]) {
      if (!p.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": a phase is not an object"));
      }
      if (auto st = AddPhase(log.header.phases, p, where); !st.ok()) return st;
    }
    if (j.contains("events")) {
      const json& ev = j["events"];
      if (!ev.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": 'events' is not an object"));
      }
      if (ev.contains("checkpoint")) {
        if (auto st = ReadEvent(ev["checkpoint"], log.header.checkpoint, where + " checkpoint");
            !st.ok()) {
          return st;
        }
      }
      if (ev.contains("eval")) {
        if (auto st = ReadEvent(ev["eval"], log.header.eval, where + " eval"); !st.ok()) {
          return st;
        }
      }
      if (ev.contains("pipeline")) {
        const json& p = ev["pipeline"];
        if (!p.is_object()) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": 'pipeline' is not an object"));
        }
        // value() throws type_error for a field of another type: reported by
        // the caller with the line.
        log.header.pipeline.stages = p.value("stages", 1);
        log.header.pipeline.micro_batches = p.value("micro_batches", 1);
        log.header.pipeline.stage = p.value("stage", 0);
        log.header.pipeline.backward_over_forward = p.value("backward_over_forward", 2.0);
      }
    }
    have_header = true;
    return absl::OkStatus();
  }
  if (type == "phase") return AddPhase(log.header.phases, j, where);
  if (type != "step") return absl::OkStatus();  // unknown line types are for newer readers
  StepRecord rec;
  for (auto [key, dst] : {std::pair<const char*, int64_t*>{"step", &rec.step},
                          {"start_ns", &rec.start_ns},
                          {"end_ns", &rec.end_ns}}) {
    auto v = GetInt(j, key, where);
    if (!v.ok()) return v.status();
    *dst = *v;
  }
  if (j.contains("spans_truncated") && !j["spans_truncated"].is_boolean()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field 'spans_truncated' is not a boolean"));
  }
  rec.spans_truncated = j.value("spans_truncated", false);
  if (!j.contains("spans") || !j["spans"].is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": step has no 'spans' array"));
  }
  if (j["spans"].size() > static_cast<size_t>(kMaxSpansPerStep)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": more than ", kMaxSpansPerStep, " spans"));
  }
  for (const json& s : j["spans"]) {
    if (!s.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": span ", rec.num_spans, " is not an object"));
    }
    if (!s.contains("phase") || !s["phase"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": span ", rec.num_spans, ": field 'phase' missing or not a string"));
    }
    PhaseSpan& sp = rec.spans[rec.num_spans++];
    auto ph = log.header.phases.Find(s["phase"].get<std::string>());
    if (!ph.ok())
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", ph.status().message()));
    sp.phase = *ph;
    for (auto [key, dst] :
         {std::pair<const char*, int64_t*>{"start_ns", &sp.start_ns}, {"end_ns", &sp.end_ns}}) {
      auto v = GetInt(s, key, where);
      if (!v.ok()) return v.status();
      *dst = *v;
    }
    auto depth = GetInt(s, "depth", where);
    if (!depth.ok()) return depth.status();
    if (*depth < 0 || *depth > kMaxPhaseDepth) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": span depth ", *depth, " out of range"));
    }
    sp.depth = static_cast<uint8_t>(*depth);
  }
  if (auto st = ValidateStepRecord(rec, log.header.phases); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", st.message()));
  }
  if (!log.steps.empty() && rec.step <= log.steps.back().step) {
    // Time moved on but the step numbers went back: a second run of the job
    // appended to the first (a resume that redoes the steps after its
    // checkpoint). omni's writers start a new file per run.
    const bool later_run = rec.start_ns >= log.steps.back().end_ns;
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": step ", rec.step, " is not after step ", log.steps.back().step,
        later_run ? " although it started later: two runs of the job in one file (a resume "
                    "redoing steps from its checkpoint?); split the file before this line and "
                    "read each run on its own"
                  : ""));
  }
  if (!log.steps.empty() && rec.start_ns < log.steps.back().start_ns) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": step ", rec.step, " starts at ", rec.start_ns, " ns, before step ",
                     log.steps.back().step, " started (", log.steps.back().start_ns,
                     " ns): the log's clock went back (two runs, or two hosts, in one file?)"));
  }
  log.steps.push_back(rec);
  return absl::OkStatus();
}

// One line's text (without its newline) into `log`; an empty line is skipped.
absl::Status ParseText(std::string_view line, const std::string& where, bool& have_header,
                       StepLog& log) {
  if (line.empty()) return absl::OkStatus();
  const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
  }
  try {
    return ParseLine(j, where, have_header, log);
  } catch (const json::exception& e) {  // a field of another type than the schema's
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": a field has the wrong type (", e.what(), ")"));
  }
}

// Whether a line's text is a step's (its "type" read as ParseLine reads it).
bool IsStepLine(std::string_view line) {
  const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("type") && j["type"] == "step";
}

absl::StatusOr<internal::Fd> OpenLog(const std::string& path) {
  // A regular file only: a FIFO would block the open, a device never end.
  absl::StatusOr<internal::Fd> fd = internal::RealFileSystem().OpenRead(AT_FDCWD, path, path);
  if (!fd.ok()) {
    return absl::Status(fd.status().code(),
                        absl::StrCat("cannot open step log ", path, ": ", fd.status().message()));
  }
  return fd;
}

// Reads `len` bytes at `offset` (fewer only at the end of the file).
absl::Status ReadAt(int fd, int64_t offset, size_t len, std::string& out, const std::string& path) {
  out.resize(len);
  size_t got = 0;
  while (got < len) {
    const ssize_t n = ::pread(fd, out.data() + got, len - got, static_cast<off_t>(offset + got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("cannot read step log ", path));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return absl::OkStatus();
}

}  // namespace

// The most of a log's head, and of its end, that ReadStepLogTail reads.
constexpr size_t kMaxTailBytes = size_t{64} << 20;

absl::StatusOr<StepLog> ReadStepLogTail(const std::string& path, int max_steps) {
  if (max_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_steps must be at least 1, not ", max_steps));
  }
  absl::StatusOr<internal::Fd> fd = OpenLog(path);
  if (!fd.ok()) return fd.status();
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) {
    return ErrnoStatus(errno, absl::StrCat("cannot stat step log ", path));
  }
  const auto size = static_cast<int64_t>(st.st_size);
  StepLog log;
  bool have_header = false;
  // The head: the header and the phase lines before the first step (at
  // most kMaxTailBytes of them: a log of lines of unknown types, which
  // readers skip, is not read whole).
  constexpr size_t kChunk = size_t{1} << 16;
  int64_t head_end = 0;  // where the first step's line begins
  std::string chunk;
  std::string line;
  int lineno = 0;
  for (bool done = false; !done && head_end < size && head_end < int64_t{kMaxTailBytes};) {
    const int64_t at = head_end + static_cast<int64_t>(line.size());
    if (absl::Status s = ReadAt(fd->get(), at, kChunk, chunk, path); !s.ok()) return s;
    if (chunk.empty()) break;
    size_t pos = 0;
    while (!done && pos < chunk.size()) {
      const size_t nl = chunk.find('\n', pos);
      line.append(chunk, pos, nl == std::string::npos ? std::string::npos : nl - pos);
      if (line.size() > kMaxStepLogLineBytes) {
        return absl::InvalidArgumentError(absl::StrCat(path, ":", lineno + 1,
                                                       ": line longer than the limit of ",
                                                       kMaxStepLogLineBytes, " bytes; not parsed"));
      }
      if (nl == std::string::npos) break;  // the line goes on in the next chunk
      pos = nl + 1;
      ++lineno;
      if (IsStepLine(line)) {
        done = true;
        break;
      }
      if (absl::Status s = ParseText(line, absl::StrCat(path, ":", lineno), have_header, log);
          !s.ok()) {
        return s;
      }
      head_end += static_cast<int64_t>(line.size()) + 1;
      line.clear();
    }
  }
  // The tail: whole lines back from the end until max_steps + 1 newlines
  // (the first line read may be cut), the head, or kMaxTailBytes (a log of
  // lines that long gives fewer steps). A stretch without a newline longer
  // than a line may be is refused as soon as it is read (a log whose end a
  // crash left filled with zeros), not read on to the head.
  int64_t from = size;
  std::vector<std::string> chunks;  // from the end backwards
  int64_t newlines = 0;
  size_t total = 0, run = 0;  // run: the bytes before the first newline read
  while (from > head_end && newlines <= max_steps && total < kMaxTailBytes) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(kChunk), from - head_end);
    from -= n;
    if (absl::Status s = ReadAt(fd->get(), from, static_cast<size_t>(n), chunk, path); !s.ok()) {
      return s;
    }
    newlines += std::count(chunk.begin(), chunk.end(), '\n');
    const size_t nl = chunk.find('\n');
    run = nl == std::string::npos ? run + chunk.size() : nl;
    if (run > kMaxStepLogLineBytes + 1) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": line at byte ", from,
                                                     " longer than the limit of ",
                                                     kMaxStepLogLineBytes, " bytes; not parsed"));
    }
    total += chunk.size();
    chunks.push_back(std::move(chunk));
    chunk.clear();
  }
  std::string tail;
  tail.reserve(total);
  for (auto it = chunks.rbegin(); it != chunks.rend(); ++it) tail += *it;
  size_t pos = 0;
  if (from > head_end) {
    // The first line read is cut (or whole by chance): the tail begins after it.
    pos = tail.find('\n') + 1;
  }
  int64_t offset = from + static_cast<int64_t>(pos);
  std::vector<std::string_view> lines;
  while (pos < tail.size()) {
    const size_t nl = tail.find('\n', pos);
    const size_t end = nl == std::string::npos ? tail.size() : nl;
    lines.emplace_back(tail.data() + pos, end - pos);
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  // A last line without its newline that is not JSON is a live writer's
  // unfinished line, as ReadStepLog has it.
  if (!tail.empty() && tail.back() != '\n' && !lines.empty() &&
      json::parse(lines.back(), nullptr, /*allow_exceptions=*/false).is_discarded()) {
    log.unfinished_tail_bytes = lines.back().size();
    lines.pop_back();
  }
  if (static_cast<int64_t>(lines.size()) > max_steps) {
    for (size_t i = 0; i + max_steps < lines.size(); ++i) {
      offset += static_cast<int64_t>(lines[i].size()) + 1;
    }
    lines.erase(lines.begin(), lines.end() - max_steps);
  }
  for (const std::string_view l : lines) {
    if (l.size() > kMaxStepLogLineBytes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": line at byte ", offset,
                                                     " longer than the limit of ",
                                                     kMaxStepLogLineBytes, " bytes; not parsed"));
    }
    if (absl::Status s =
            ParseText(l, absl::StrCat(path, ": line at byte ", offset), have_header, log);
        !s.ok()) {
      return s;
    }
    offset += static_cast<int64_t>(l.size()) + 1;
  }
  if (!have_header) return absl::InvalidArgumentError(absl::StrCat(path, ": empty step log"));
  return log;
}

absl::StatusOr<StepLog> ReadStepLog(const std::string& path) {
  absl::StatusOr<internal::Fd> fd = OpenLog(path);
  if (!fd.ok()) return fd.status();
  StepLog log;
  std::string line;
  int lineno = 0;
  bool have_header = false;
  bool too_long = false;
  std::vector<char> buf(size_t{1} << 16);
  const auto finish_line = [&]() -> absl::Status {
    ++lineno;
    const std::string where = absl::StrCat(path, ":", lineno);
    if (too_long) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": line longer than the limit of ",
                                                     kMaxStepLogLineBytes, " bytes; not parsed"));
    }
    return ParseText(line, where, have_header, log);
  };
  while (true) {
    const ssize_t n = ::read(fd->get(), buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("cannot read step log ", path));
    }
    if (n == 0) break;
    size_t pos = 0;
    const auto got = static_cast<size_t>(n);
    while (pos < got) {
      const char* start = buf.data() + pos;
      const char* nl = static_cast<const char*>(std::memchr(start, '\n', got - pos));
      const size_t len = nl != nullptr ? static_cast<size_t>(nl - start) : got - pos;
      if (!too_long) {
        if (line.size() + len > kMaxStepLogLineBytes) {
          too_long = true;
          line.clear();
          line.shrink_to_fit();
        } else {
          line.append(start, len);
        }
      }
      pos += len;
      if (nl != nullptr) {
        ++pos;
        if (absl::Status st = finish_line(); !st.ok()) return st;
        line.clear();
        too_long = false;
      }
    }
  }
  if (!line.empty() || too_long) {
    // No newline: the line a live writer has not finished, when it is not
    // JSON yet (a complete last line only lacking its newline is read).
    if (!too_long && json::parse(line, nullptr, /*allow_exceptions=*/false).is_discarded()) {
      log.unfinished_tail_bytes = line.size();
    } else if (absl::Status st = finish_line(); !st.ok()) {
      return st;
    }
  }
  if (!have_header) return absl::InvalidArgumentError(absl::StrCat(path, ": empty step log"));
  return log;
}

absl::StatusOr<std::vector<StepRecord>> PreviousRunSteps(const StepLog& previous,
                                                         const StepRecord& first,
                                                         const PhaseCatalog& catalog,
                                                         int max_steps) {
  const PhaseCatalog& was = previous.header.phases;
  std::vector<PhaseId> rename(static_cast<size_t>(was.size()));
  for (int p = 0; p < was.size(); ++p) {
    const auto id = static_cast<PhaseId>(p);
    const absl::StatusOr<PhaseId> now = catalog.Find(was.name(id));
    if (!now.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("the previous run's phase '", was.name(id),
                                                        "' is not registered in this run"));
    }
    if (catalog.idle_kind(*now) != was.idle_kind(id)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the previous run's phase '", was.name(id), "' was ", IdleKindName(was.idle_kind(id)),
          ", in this run it is ", IdleKindName(catalog.idle_kind(*now))));
    }
    rename[static_cast<size_t>(p)] = *now;
  }
  const auto& steps = previous.steps;
  const auto end =
      std::lower_bound(steps.begin(), steps.end(), first.step,
                       [](const StepRecord& r, int64_t step) { return r.step < step; });
  const auto begin = end - std::min<std::ptrdiff_t>(end - steps.begin(), std::max(max_steps, 0));
  std::vector<StepRecord> out;
  if (begin == end) return out;
  // A log built in code, not read by ReadStepLog: its phases are renamed
  // and its clock moved below.
  for (auto it = begin; it < end; ++it) {
    if (auto st = ValidateStepRecord(*it, was); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("the previous run's ", st.message()));
    }
    if (it != begin && (it->step <= (it - 1)->step || it->start_ns < (it - 1)->start_ns)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the previous run's step ", it->step, " is out of order after step ", (it - 1)->step));
    }
  }
  // The usual gap between two logged steps (a sampled log's gaps include the
  // steps it left out: the gap between the runs is then as long).
  std::vector<int64_t> gaps;
  for (auto it = begin + 1; it < end; ++it) gaps.push_back(it->start_ns - (it - 1)->end_ns);
  int64_t gap = 0;
  if (!gaps.empty()) {
    std::nth_element(gaps.begin(), gaps.begin() + gaps.size() / 2, gaps.end());
    gap = std::max<int64_t>(gaps[gaps.size() / 2], 0);
  }
  const int64_t shift = first.start_ns - gap - (end - 1)->end_ns;
  out.reserve(static_cast<size_t>(end - begin));
  for (auto it = begin; it < end; ++it) {
    if (it->start_ns + shift < 0) continue;
    StepRecord r = *it;
    r.start_ns += shift;
    r.end_ns += shift;
    for (int i = 0; i < r.num_spans; ++i) {
      PhaseSpan& s = r.spans[static_cast<size_t>(i)];
      s.start_ns += shift;
      s.end_ns += shift;
      s.phase = rename[s.phase];
    }
    out.push_back(r);
  }
  return out;
}

}  // namespace omni
