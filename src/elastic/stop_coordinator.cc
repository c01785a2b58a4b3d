#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "omni/preemption.h"

namespace omni {
namespace {

constexpr const char* kStopKey = "stop";

// "<step> <save|exit> <reason>"
std::string Encode(int64_t step, const BoundaryDecision& d) {
  return absl::StrCat(step, " ", d.action == BoundaryAction::kSaveAndExit ? "save" : "exit", " ",
                      d.reason);
}

absl::Status Decode(const std::string& v, int64_t& step, BoundaryDecision& d) {
  std::vector<std::string> parts = absl::StrSplit(v, absl::MaxSplits(' ', 2));
  if (parts.size() < 2 || !absl::SimpleAtoi(parts[0], &step) ||
      (parts[1] != "save" && parts[1] != "exit")) {
    return absl::InvalidArgumentError(
        absl::StrCat("store key '", kStopKey, "' holds a malformed agreement: '", v, "'"));
  }
  d.action = parts[1] == "save" ? BoundaryAction::kSaveAndExit : BoundaryAction::kExitWithoutSave;
  d.reason = parts.size() > 2 ? parts[2] : "";
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BoundaryDecision> StopCoordinator::AtBoundary(int64_t step,
                                                             const BoundaryDecision& local) {
  if (agreed_step_ < 0) {
    absl::StatusOr<std::optional<std::string>> v = store_.TryGet(kStopKey);
    if (!v.ok()) return v.status();
    if (!v->has_value() && local.action != BoundaryAction::kContinue) {
      BoundaryDecision proposal = local;
      proposal.reason = absl::StrCat("agreed stop after step ", step + 1, " (proposed after step ",
                                     step, "): ", local.reason);
      absl::StatusOr<std::string> won =
          store_.CompareAndSet(kStopKey, "", Encode(step + 1, proposal));
      if (!won.ok()) return won.status();
      *v = *won;
    }
    if (v->has_value()) {
      if (auto st = Decode(**v, agreed_step_, agreed_); !st.ok()) return st;
      agreed_.deadline_ns = local.deadline_ns;
    }
  }
  if (agreed_step_ < 0 || step < agreed_step_) {
    BoundaryDecision cont;
    cont.deadline_ns = local.deadline_ns;
    return cont;
  }
  if (step > agreed_step_) {
    return absl::InternalError(absl::StrCat("rank is at the boundary after step ", step,
                                            ", past the agreed stop after step ", agreed_step_,
                                            ": the ranks are not in lockstep"));
  }
  return agreed_;
}

}  // namespace omni
