#include "omni/colocate_policy.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace omni::colocate {

namespace {

int64_t Scaled(int64_t ns, double factor) {
  return static_cast<int64_t>(std::ceil(static_cast<double>(std::max<int64_t>(ns, 0)) * factor));
}

std::string Ms(int64_t ns) { return absl::StrCat(static_cast<double>(ns) / 1e6, " ms"); }

}  // namespace

const char* JobClassName(JobClass c) {
  switch (c) {
    case JobClass::kCritical:
      return "critical";
    case JobClass::kRegular:
      return "regular";
    case JobClass::kBestEffort:
      return "best_effort";
  }
  return "unknown";
}

const char* NoticeKindName(NoticeKind k) {
  switch (k) {
    case NoticeKind::kByDeadline:
      return "by_deadline";
    case NoticeKind::kAsapWithSave:
      return "asap_with_save";
    case NoticeKind::kNowWithoutSave:
      return "now_without_save";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<Policy>> Policy::Create(const PolicyOptions& options,
                                                       const Clock* clock) {
  if (clock == nullptr) return absl::InvalidArgumentError("colocate policy: clock is null");
  if (options.min_run < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("colocate policy: min_run is negative");
  }
  if (options.guard < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("colocate policy: guard is negative");
  }
  if (options.max_save_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("colocate policy: max_save_wait is negative");
  }
  if (!(options.min_confidence >= 0 && options.min_confidence <= 1)) {
    return absl::InvalidArgumentError("colocate policy: min_confidence is outside [0, 1]");
  }
  if (!std::isfinite(options.slack) || options.slack < 0) {
    return absl::InvalidArgumentError("colocate policy: slack is negative or not finite");
  }
  return std::make_unique<Policy>(options, clock);
}

Policy::Policy(const PolicyOptions& options, const Clock* clock)
    : options_(options),
      clock_(clock),
      min_run_ns_(absl::ToInt64Nanoseconds(options.min_run)),
      guard_ns_(absl::ToInt64Nanoseconds(options.guard)),
      max_save_wait_ns_(absl::ToInt64Nanoseconds(options.max_save_wait)) {}

std::optional<Lease> Policy::LeaseFor(const IdleWindowForecast& window,
                                      std::optional<int64_t> opened_at_ns) const {
  if (window.confidence < options_.min_confidence || window.guaranteed_ns <= 0) {
    return std::nullopt;
  }
  Lease lease;
  if (opened_at_ns.has_value()) {
    lease.open_ns = *opened_at_ns;
    lease.close_ns = *opened_at_ns + window.guaranteed_ns - guard_ns_;
  } else {
    // Idle whatever the actual start in [earliest, latest].
    lease.open_ns = window.start_latest_ns;
    lease.close_ns = window.start_earliest_ns + window.guaranteed_ns - guard_ns_;
  }
  lease.open_ns = std::max(lease.open_ns, clock_->NowNanos());
  if (lease.close_ns <= lease.open_ns) return std::nullopt;
  return lease;
}

YieldNotice Policy::NoticeBeforeReservation(int64_t reservation_ns, const YieldBounds& bounds,
                                            bool must_save) const {
  const double f = 1.0 + options_.slack;
  const int64_t need =
      must_save ? Scaled(bounds.next_step_ns + bounds.save_ns, f) : Scaled(bounds.next_step_ns, f);
  YieldNotice n;
  n.kind = NoticeKind::kByDeadline;
  n.deadline_ns = reservation_ns - guard_ns_;
  n.send_at_ns = n.deadline_ns - need;
  const int64_t now = clock_->NowNanos();
  n.reason = absl::StrCat("reservation at ", reservation_ns, ", leave by ", n.deadline_ns,
                          must_save ? " with a save" : " after the unit in flight", " (needs ",
                          Ms(need), ")");
  if (n.send_at_ns < now) {
    absl::StrAppend(&n.reason, "; notice late by ", Ms(now - n.send_at_ns));
    n.send_at_ns = now;
  }
  return n;
}

NoticeKind Policy::KindFor(const JobView& job, int64_t needed_by_ns, int64_t* step_and_save) const {
  *step_and_save = Scaled(job.bounds.next_step_ns + job.bounds.save_ns, 1.0 + options_.slack);
  if (needed_by_ns - clock_->NowNanos() >= *step_and_save) return NoticeKind::kByDeadline;
  if (*step_and_save <= max_save_wait_ns_) return NoticeKind::kAsapWithSave;
  return NoticeKind::kNowWithoutSave;
}

YieldNotice Policy::NoticeForPreemption(const JobView& job, int64_t needed_by_ns) const {
  const int64_t now = clock_->NowNanos();
  int64_t step_and_save = 0;
  const NoticeKind kind = KindFor(job, needed_by_ns, &step_and_save);
  YieldNotice n;
  n.send_at_ns = now;
  if (kind == NoticeKind::kByDeadline) {
    n.kind = NoticeKind::kByDeadline;
    n.deadline_ns = needed_by_ns;
    n.reason = absl::StrCat("devices wanted in ", Ms(needed_by_ns - now), " >= step + save ",
                            Ms(step_and_save), ": progress until then, then save");
  } else if (kind == NoticeKind::kAsapWithSave) {
    n.kind = NoticeKind::kAsapWithSave;
    n.deadline_ns = now + step_and_save;
    n.reason = absl::StrCat("devices wanted now; step + save ", Ms(step_and_save),
                            " within the wait allowed (", Ms(max_save_wait_ns_), ")");
  } else {
    n.kind = NoticeKind::kNowWithoutSave;
    n.deadline_ns = now;
    n.reason = absl::StrCat("devices wanted now; step + save ", Ms(step_and_save),
                            " exceeds the wait allowed (", Ms(max_save_wait_ns_), ")");
  }
  return n;
}

bool Policy::Preemptible(const JobView& job) const {
  switch (job.job_class) {
    case JobClass::kCritical:
      return false;
    case JobClass::kBestEffort:
      return true;
    case JobClass::kRegular:
      return clock_->NowNanos() - job.running_since_ns >= min_run_ns_;
  }
  return false;
}

std::optional<int64_t> Policy::NextPreemptible(const std::vector<JobView>& running) const {
  std::optional<int64_t> next;
  for (const JobView& j : running) {
    if (j.job_class != JobClass::kRegular || Preemptible(j)) continue;
    const int64_t t = j.running_since_ns + min_run_ns_;
    if (!next.has_value() || t < *next) next = t;
  }
  return next;
}

int64_t Policy::LostDeviceNs(const JobView& job, int64_t needed_by_ns) const {
  int64_t step_and_save = 0;
  if (KindFor(job, needed_by_ns, &step_and_save) != NoticeKind::kNowWithoutSave) {
    return 0;  // it finishes the step in flight and saves: nothing to redo
  }
  return std::max<int64_t>(0, clock_->NowNanos() - job.last_checkpoint_ns) * job.devices;
}

absl::StatusOr<Victims> Policy::ChooseVictims(const std::vector<JobView>& running,
                                              int devices_needed, int64_t needed_by_ns) const {
  if (devices_needed < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("colocate policy: devices_needed is ", devices_needed, " (< 1)"));
  }
  const int64_t now = clock_->NowNanos();
  struct Candidate {
    int rank;  // 0: best-effort (reclaimable at any time), 1: regular
    int64_t lost;
    int64_t since_ckpt;
    uint64_t id;
    size_t index;
  };
  std::vector<Candidate> cands;
  int preemptible_devices = 0;
  int waiting_devices = 0;
  for (size_t i = 0; i < running.size(); ++i) {
    const JobView& j = running[i];
    if (!Preemptible(j)) {
      if (j.job_class == JobClass::kRegular) waiting_devices += j.devices;
      continue;
    }
    preemptible_devices += j.devices;
    cands.push_back({j.job_class == JobClass::kBestEffort ? 0 : 1, LostDeviceNs(j, needed_by_ns),
                     std::max<int64_t>(0, now - j.last_checkpoint_ns) * j.devices, j.id, i});
  }
  if (preemptible_devices < devices_needed) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "colocate policy: ", devices_needed, " devices needed, ", preemptible_devices,
        " preemptible now (", waiting_devices, " more on regular jobs within their min_run)"));
  }
  auto key = [](const Candidate& c) { return std::tie(c.rank, c.lost, c.since_ckpt, c.id); };
  // Greedy in key order by least loss: a heap, popped only as far as needed
  // (O(n + k log n); a cluster has thousands of candidates, a need a few).
  auto later = [&](const Candidate& a, const Candidate& b) { return key(b) < key(a); };
  std::make_heap(cands.begin(), cands.end(), later);
  std::vector<Candidate> greedy;
  int greedy_rank = 0;
  int64_t greedy_lost = 0;
  int64_t greedy_since = 0;
  int got = 0;
  for (auto end = cands.end(); got < devices_needed && end != cands.begin(); --end) {
    std::pop_heap(cands.begin(), end, later);
    const Candidate& c = *(end - 1);
    greedy.push_back(c);
    greedy_rank = std::max(greedy_rank, c.rank);
    got += running[c.index].devices;
    greedy_lost += c.lost;
    greedy_since += c.since_ckpt;
  }
  // ...unless one job alone frees enough, of no higher class, and loses less.
  const Candidate* single = nullptr;
  for (const Candidate& c : cands) {
    if (running[c.index].devices < devices_needed) continue;
    if (single == nullptr || key(c) < key(*single)) single = &c;
  }
  if (single != nullptr && std::tie(single->rank, single->lost, single->since_ckpt) <
                               std::tie(greedy_rank, greedy_lost, greedy_since)) {
    greedy = {*single};
  }
  Victims v;
  for (const Candidate& c : greedy) {
    const JobView& j = running[c.index];
    v.ids.push_back(j.id);
    v.devices += j.devices;
    v.lost_device_ns += c.lost;
    v.notices.push_back(NoticeForPreemption(j, needed_by_ns));
  }
  return v;
}

}  // namespace omni::colocate
