#include "runtime/previous_run.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"

namespace omni::internal {

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

}  // namespace omni::internal
