#include "runtime/trace_writer.h"

#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/fs.h"
#include "runtime/output_rotation.h"

namespace omni::internal {

absl::StatusOr<std::unique_ptr<TraceWriter>> TraceWriter::Open(const std::string& path,
                                                               const std::string& process_name,
                                                               bool keep_previous) {
  if (keep_previous) {
    if (auto moved = MoveAside(path); !moved.ok()) return moved.status();
  }
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return ErrnoStatus(errno, absl::StrCat("cannot open trace file ", path));
  auto w = std::make_unique<TraceWriter>(f, path);
  w->buf_ = absl::StrCat(
      "[{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"",
      process_name, "\"}},\n",
      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"training "
      "steps\"}}");
  if (std::fputs(w->buf_.c_str(), f) < 0) {
    return ErrnoStatus(errno, absl::StrCat("cannot write trace file ", path));
  }
  return w;
}

TraceWriter::~TraceWriter() { Close().IgnoreError(); }

absl::Status TraceWriter::Append(const StepRecord& rec, const PhaseCatalog& catalog, bool warmup) {
  if (file_ == nullptr) return absl::FailedPreconditionError("trace file is closed");
  if (base_ns_ < 0) base_ns_ = rec.start_ns;
  const auto us = [&](int64_t ns) { return static_cast<double>(ns - base_ns_) / 1e3; };
  buf_.clear();
  absl::StrAppend(
      &buf_,
      absl::StrFormat(",\n{\"name\":\"step %d\",\"cat\":\"step\",\"ph\":\"X\",\"pid\":1,"
                      "\"tid\":1,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"step\":%d,"
                      "\"kind\":\"%s\",\"warmup\":%s}}",
                      rec.step, us(rec.start_ns), static_cast<double>(rec.duration_ns()) / 1e3,
                      rec.step, std::string(StepKindName(rec.kind())), warmup ? "true" : "false"));
  for (int i = 0; i < rec.num_spans; ++i) {
    const PhaseSpan& s = rec.spans[i];
    const IdleKind k = catalog.idle_kind(s.phase);
    absl::StrAppend(
        &buf_, absl::StrFormat(",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":1,"
                               "\"tid\":1,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"step\":%d}}",
                               catalog.name(s.phase), k == IdleKind::kNone ? "busy" : "idle",
                               us(s.start_ns), static_cast<double>(s.end_ns - s.start_ns) / 1e3,
                               rec.step));
  }
  // Flushed per step (on the telemetry worker, off the training thread), so
  // that a process killed at any time leaves whole events: only the closing
  // ']' is missing, which the Trace Event Format's array form allows.
  if (std::fwrite(buf_.data(), 1, buf_.size(), file_) != buf_.size() || std::fflush(file_) != 0) {
    return ErrnoStatus(errno, absl::StrCat("cannot write trace file ", path_));
  }
  return absl::OkStatus();
}

absl::Status TraceWriter::Close() {
  if (file_ == nullptr) return absl::OkStatus();
  absl::Status st;
  if (std::fputs("\n]\n", file_) < 0 || std::fflush(file_) != 0) {
    st = ErrnoStatus(errno, absl::StrCat("cannot write trace file ", path_));
  } else if (::fsync(fileno(file_)) != 0) {
    st = ErrnoStatus(errno, absl::StrCat("cannot fsync trace file ", path_));
  }
  if (std::fclose(file_) != 0 && st.ok()) {
    st = ErrnoStatus(errno, absl::StrCat("cannot close trace file ", path_));
  }
  file_ = nullptr;
  return st;
}

}  // namespace omni::internal
