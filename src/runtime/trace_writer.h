// Chrome-trace / Perfetto JSON timeline of steps and phases (private).
// Written in the JSON Array Format, one event per line, so that a trace cut
// short by a crash still opens in ui.perfetto.dev (the Trace Event Format
// makes the closing ']' of the array optional); Close() adds it.
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "omni/phase.h"

namespace omni::internal {

class TraceWriter {
 public:
  // Creates or truncates `path`; with keep_previous an existing file is
  // moved to the first free "<path>.N" first (see MoveAside).
  static absl::StatusOr<std::unique_ptr<TraceWriter>> Open(const std::string& path,
                                                           const std::string& process_name,
                                                           bool keep_previous = false);
  // Use Open().
  TraceWriter(std::FILE* f, std::string path) : file_(f), path_(std::move(path)) {}
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  absl::Status Append(const StepRecord& rec, const PhaseCatalog& catalog, bool warmup);
  absl::Status Close();

 private:
  std::FILE* file_;
  std::string path_;
  int64_t base_ns_ = -1;
  std::string buf_;
};

}  // namespace omni::internal
