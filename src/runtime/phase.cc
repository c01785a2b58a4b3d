#include "omni/phase.h"

#include "absl/strings/str_cat.h"
#include "common/strings.h"

namespace omni {

using internal::Sv;

const char* IdleKindName(IdleKind kind) {
  switch (kind) {
    case IdleKind::kNone:
      return "busy";
    case IdleKind::kDataStall:
      return "data_stall";
    case IdleKind::kCheckpoint:
      return "checkpoint";
    case IdleKind::kEval:
      return "eval";
    case IdleKind::kPipelineBubble:
      return "pipeline_bubble";
    case IdleKind::kHostSide:
      return "host_side";
  }
  return "unknown";
}

absl::StatusOr<IdleKind> ParseIdleKind(std::string_view name) {
  for (int i = 0; i < kNumIdleKinds; ++i) {
    const auto k = static_cast<IdleKind>(i);
    if (IdleKindName(k) == name) return k;
  }
  if (name == "none") return IdleKind::kNone;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown idle kind '", Sv(name),
      "' (expected busy, data_stall, checkpoint, eval, pipeline_bubble or host_side)"));
}

const char* StepKindName(StepKind kind) {
  switch (kind) {
    case StepKind::kNormal:
      return "normal";
    case StepKind::kCheckpoint:
      return "checkpoint";
    case StepKind::kEval:
      return "eval";
  }
  return "unknown";
}

PhaseCatalog::PhaseCatalog() {
  const struct {
    const char* name;
    IdleKind kind;
  } builtins[phase::kNumBuiltin] = {
      {"data_wait", IdleKind::kDataStall},
      {"compute", IdleKind::kNone},
      {"comm", IdleKind::kNone},
      {"optimizer", IdleKind::kNone},
      {"checkpoint", IdleKind::kCheckpoint},
      {"eval", IdleKind::kEval},
      {"pipeline_bubble", IdleKind::kPipelineBubble},
      {"host", IdleKind::kHostSide},
  };
  for (const auto& b : builtins) {
    names_[size_] = b.name;
    kinds_[size_] = b.kind;
    ++size_;
  }
}

absl::StatusOr<PhaseId> PhaseCatalog::Register(std::string_view name, IdleKind idle) {
  if (name.empty()) return absl::InvalidArgumentError("phase name is empty");
  if (name.size() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("phase name '", Sv(name), "' is longer than 64"));
  }
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-' || c == '/';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("phase name '", Sv(name), "' has a character outside [A-Za-z0-9_.-/]"));
    }
  }
  if (static_cast<int>(idle) >= kNumIdleKinds) {
    return absl::InvalidArgumentError(absl::StrCat("phase '", Sv(name), "': invalid idle kind"));
  }
  for (int i = 0; i < size_; ++i) {
    if (names_[i] == name) {
      if (kinds_[i] != idle) {
        return absl::AlreadyExistsError(absl::StrCat("phase '", Sv(name), "' is registered as ",
                                                     IdleKindName(kinds_[i]), ", not ",
                                                     IdleKindName(idle)));
      }
      return static_cast<PhaseId>(i);
    }
  }
  if (size_ >= kMaxPhases) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot register phase '", Sv(name), "': all ",
                                                     kMaxPhases, " phases are in use"));
  }
  names_[size_] = std::string(name);
  kinds_[size_] = idle;
  return static_cast<PhaseId>(size_++);
}

absl::StatusOr<PhaseId> PhaseCatalog::Find(std::string_view name) const {
  for (int i = 0; i < size_; ++i) {
    if (names_[i] == name) return static_cast<PhaseId>(i);
  }
  return absl::NotFoundError(absl::StrCat("phase '", Sv(name), "' is not registered"));
}

StepKind StepRecord::kind() const {
  bool eval = false;
  for (int i = 0; i < num_spans; ++i) {
    if (spans[i].phase == phase::kCheckpoint) return StepKind::kCheckpoint;
    if (spans[i].phase == phase::kEval) eval = true;
  }
  return eval ? StepKind::kEval : StepKind::kNormal;
}

absl::Status ValidateStepRecord(const StepRecord& rec, const PhaseCatalog& catalog) {
  if (rec.step < 0 || rec.step > kMaxStepNumber) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", rec.step, ": step number outside [0, 2^61] (0, ", kMaxStepNumber, ")"));
  }
  for (const int64_t t : {rec.start_ns, rec.end_ns}) {
    if (t < 0 || t > kMaxClockNs) {
      return absl::InvalidArgumentError(absl::StrCat("step ", rec.step, ": clock reading ", t,
                                                     " ns outside [0, 2^62] (0, ", kMaxClockNs,
                                                     ")"));
    }
  }
  if (rec.end_ns < rec.start_ns) {
    return absl::InvalidArgumentError(absl::StrCat("step ", rec.step, ": ends before it starts (",
                                                   rec.end_ns - rec.start_ns, " ns)"));
  }
  if (rec.num_spans > kMaxSpansPerStep) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", rec.step, ": ", rec.num_spans, " spans exceed ", kMaxSpansPerStep));
  }
  // Open spans by depth, to check nesting.
  std::array<int64_t, kMaxPhaseDepth + 1> open_end{};
  int64_t prev_start = rec.start_ns;
  for (int i = 0; i < rec.num_spans; ++i) {
    const PhaseSpan& s = rec.spans[i];
    const auto where = [&] {
      return absl::StrCat("step ", rec.step, ", span ", i, " (phase ",
                          catalog.Contains(s.phase) ? catalog.name(s.phase) : "?", ")");
    };
    if (!catalog.Contains(s.phase)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), ": unknown phase id ", static_cast<int>(s.phase)));
    }
    if (s.end_ns < s.start_ns || s.start_ns < rec.start_ns || s.end_ns > rec.end_ns) {
      return absl::InvalidArgumentError(absl::StrCat(where(), ": not inside the step"));
    }
    if (s.start_ns < prev_start) {
      return absl::InvalidArgumentError(absl::StrCat(where(), ": spans not in start order"));
    }
    prev_start = s.start_ns;
    if (s.depth > kMaxPhaseDepth) {
      return absl::InvalidArgumentError(absl::StrCat(where(), ": depth ", s.depth, " too deep"));
    }
    if (s.depth > 0) {
      // Must lie inside the most recent span one level up.
      bool parent = false;
      for (int j = i - 1; j >= 0; --j) {
        if (rec.spans[j].depth == s.depth - 1) {
          parent = rec.spans[j].start_ns <= s.start_ns && s.end_ns <= rec.spans[j].end_ns;
          break;
        }
      }
      if (!parent) {
        return absl::InvalidArgumentError(
            absl::StrCat(where(), ": not nested inside a span of depth ", s.depth - 1));
      }
    }
    // A sibling at the same depth must not overlap the previous one.
    if (open_end[s.depth] > s.start_ns && i > 0) {
      for (int j = i - 1; j >= 0; --j) {
        if (rec.spans[j].depth < s.depth) break;
        if (rec.spans[j].depth == s.depth && rec.spans[j].end_ns > s.start_ns) {
          return absl::InvalidArgumentError(
              absl::StrCat(where(), ": overlaps the previous phase at the same depth"));
        }
      }
    }
    open_end[s.depth] = s.end_ns;
  }
  return absl::OkStatus();
}

}  // namespace omni
