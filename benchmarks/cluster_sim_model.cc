#include "cluster_sim_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <queue>
#include <random>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "omni/clock.h"
#include "omni/colocate_gate.h"
#include "omni/evaluator.h"
#include "omni/phase.h"
#include "omni/step_log.h"

namespace omni::clustersim {

using colocate::GateOptions;
using colocate::GuestGate;
using colocate::IdleWindowForecast;
using colocate::JobClass;
using colocate::JobView;
using colocate::NoticeKind;
using colocate::OpenWindow;
using colocate::Policy;
using colocate::PolicyOptions;

// ================================================================= replay

absl::StatusOr<StepProfile> ReplayStepLog(const std::string& path, const ReplayOptions& options) {
  absl::StatusOr<StepLog> log = ReadStepLog(path);
  if (!log.ok()) return log.status();
  if (log->steps.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": fewer than two steps"));
  }
  StepProfile p;
  p.name = std::filesystem::path(path).filename().string();
  // The real idle windows (the idle phases, innermost-phase rule), in time
  // order: what the live notices are about.
  const PhaseCatalog& catalog = log->header.phases;
  std::vector<std::pair<int64_t, int64_t>> windows;
  double total_ns = 0, idle_ns = 0;
  for (const StepRecord& r : log->steps) {
    total_ns += static_cast<double>(r.duration_ns());
    ForEachPhaseWindow(r, catalog, [&](const PhaseWindow& w) {
      if (catalog.idle_kind(w.phase) == IdleKind::kNone || w.end_ns <= w.start_ns) return;
      windows.emplace_back(w.start_ns, w.end_ns);
      idle_ns += static_cast<double>(w.end_ns - w.start_ns);
    });
  }
  std::sort(windows.begin(), windows.end());
  p.windows = static_cast<int64_t>(windows.size());
  p.idle_fraction = total_ns > 0 ? idle_ns / total_ns : 0;

  // What the runtime's live notices told a guest in each window (learned
  // online from the windows before it, matched to the forecast's windows):
  // the claims omni eval scores.
  EvaluateOptions eo;
  eo.notices.confidence = options.confidence;
  eo.keep_notice_claims = true;
  absl::StatusOr<EvaluationReport> report = Evaluate(*log, eo);
  if (!report.ok()) {
    return absl::Status(report.status().code(),
                        absl::StrCat(path, ": ", report.status().message()));
  }

  // Each claim replayed through the policy's lease and the guest gate.
  FakeClock clock(0);
  PolicyOptions po;
  po.guard = absl::ZeroDuration();  // the gate holds the guard
  po.min_confidence = options.confidence;
  auto policy = Policy::Create(po, &clock);
  if (!policy.ok()) return policy.status();
  GateOptions go;
  go.guard = absl::Nanoseconds(options.guard_ns);
  go.min_confidence = options.confidence;
  auto gate = GuestGate::Create(go, &clock);
  if (!gate.ok()) return gate.status();
  double harvested_ns = 0;
  int64_t busy_until = 0;  // the end of the guest's last unit
  uint64_t id = 0;
  // The guest's work in [t0, claim end) of one window (open, close): a lease
  // from the policy, then units while the gate lets it start them.
  const auto work = [&](int64_t t0, int64_t claim_end, int64_t open, int64_t close) {
    if (t0 >= close || t0 >= claim_end) return;
    clock.Set(t0);
    const IdleWindowForecast w{t0, t0, claim_end - t0, claim_end - t0, options.confidence};
    std::optional<colocate::Lease> lease = (*policy)->LeaseFor(w, t0);
    const uint64_t wid = id++;
    if (!lease.has_value()) return;
    OpenWindow ow;
    ow.open = true;
    ow.window_id = wid;
    ow.opened_at_ns = open;
    ow.remaining_ns = lease->close_ns - t0;
    ow.as_of_ns = t0;
    ow.confidence = options.confidence;
    int64_t t = t0;
    for (;;) {
      clock.Set(t);
      if (!(*gate)->BeforeUnit(ow, options.guest_unit_ns).start()) break;
      const int64_t end = t + options.guest_unit_ns;
      ++p.guest_units;
      busy_until = end;
      harvested_ns += static_cast<double>(std::max<int64_t>(0, std::min(end, close) - t));
      if (end > close) {
        (*gate)->HostClosed(wid, close);  // the host left its idle phase early
        (*gate)->UnitDone(end);
        break;
      }
      (*gate)->UnitDone(end);
      t = end;
    }
  };
  // Each claim in each window it overlaps. The guest starts no earlier than
  // a window's open, which it learns from the open notice (a forecast's
  // claim that began before, in time still busy, waits for it), and uses
  // the claim to its end.
  for (const NoticeClaim& c :
       options.use_forecasts ? report->combined_claims : report->notice_claims) {
    auto it = std::upper_bound(windows.begin(), windows.end(),
                               std::make_pair(c.start_ns, std::numeric_limits<int64_t>::max()));
    if (it != windows.begin() && std::prev(it)->second > c.start_ns) --it;
    for (; it != windows.end() && it->first < c.end_ns; ++it) {
      const int64_t open = it->first, close = it->second;
      const int64_t from = c.start_ns <= open ? open + options.notice_latency_ns : c.start_ns;
      work(std::max(from, busy_until), c.end_ns, open, close);
    }
  }
  const colocate::GateStats st = (*gate)->Stats();
  p.harvest_fraction = idle_ns > 0 ? harvested_ns / idle_ns : 0;
  p.host_slowdown = total_ns > 0 ? static_cast<double>(st.overrun_ns) / total_ns : 0;
  p.deadline_misses = st.deadline_misses;
  p.yield_p99_ms = static_cast<double>(st.yield_p99_ns) / 1e6;
  return p;
}

absl::StatusOr<std::vector<StepProfile>> LoadProfiles(const std::string& dir,
                                                      const ReplayOptions& options) {
  std::error_code ec;
  std::vector<std::string> paths;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".jsonl") paths.push_back(e.path().string());
  }
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  if (paths.empty()) return absl::NotFoundError(absl::StrCat("no *.jsonl step logs in ", dir));
  std::sort(paths.begin(), paths.end());
  std::vector<StepProfile> out;
  for (const std::string& p : paths) {
    absl::StatusOr<StepProfile> prof = ReplayStepLog(p, options);
    if (!prof.ok()) return prof.status();
    out.push_back(*std::move(prof));
  }
  return out;
}

// =============================================================== workload

namespace {

double Uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

}  // namespace

std::vector<JobSpec> GenerateJobs(const WorkloadOptions& o, int num_profiles) {
  std::mt19937_64 rng(o.seed);
  const double rate_per_s = o.jobs_per_device_day * o.load_factor * o.devices / 86400.0;
  const double end_s = (o.warmup_days + o.days) * 86400.0;
  std::vector<JobSpec> jobs;
  double t = 0;
  for (uint64_t id = 0; rate_per_s > 0; ++id) {
    t += -std::log(1.0 - Uniform(rng)) / rate_per_s;
    if (t >= end_s) break;
    JobSpec j;
    j.id = id;
    j.arrival_s = t;
    const double r = Uniform(rng);
    j.devices = r < 0.70 ? 1 : r < 0.80 ? 2 : r < 0.95 ? 4 : 8;
    j.work_s = Uniform(rng) >= 0.8 ? 60 * std::pow(10.0, 3 + Uniform(rng))
                                   : 60 * std::pow(10.0, 1.5 + 1.5 * Uniform(rng));
    const double c = Uniform(rng);
    j.job_class = c < o.critical_share                         ? JobClass::kCritical
                  : c < o.critical_share + o.best_effort_share ? JobClass::kBestEffort
                                                               : JobClass::kRegular;
    j.profile =
        num_profiles > 0 ? static_cast<int>(rng() % static_cast<uint64_t>(num_profiles)) : 0;
    jobs.push_back(j);
  }
  return jobs;
}

double OfferedLoad(const WorkloadOptions& o) {
  const double mean_devices = 0.70 * 1 + 0.10 * 2 + 0.15 * 4 + 0.05 * 8;
  // E[60·10^U(a,b)] = 60·(10^b − 10^a) / ((b − a)·ln 10).
  auto mean_pow = [](double a, double b) {
    return 60 * (std::pow(10.0, b) - std::pow(10.0, a)) / ((b - a) * std::log(10.0));
  };
  const double mean_run_s = 0.8 * mean_pow(1.5, 3) + 0.2 * mean_pow(3, 4);
  return o.jobs_per_device_day * o.load_factor * mean_devices * mean_run_s / 86400.0;
}

// ============================================================= simulation

const char* SimPolicyName(SimPolicy p) {
  switch (p) {
    case SimPolicy::kStatic:
      return "static";
    case SimPolicy::kKillRequeue:
      return "kill_requeue";
    case SimPolicy::kColocate:
      return "colocate";
  }
  return "unknown";
}

namespace {

enum class St : uint8_t { kPending, kQueued, kRunning, kGuest, kSaving, kDone };

struct Job {
  const JobSpec* spec = nullptr;
  St st = St::kPending;
  double progress = 0;  // seconds of its run time done
  double rate = 0;      // progress per second now
  double updated = 0;
  double run_start = 0;
  double run_start_progress = 0;
  double held_since = 0;
  double completion = -1;
  uint64_t version = 0;
  int preemptions = 0;
  int host = -1;          // for a guest
  int guest_devices = 0;  // for a host
  std::vector<int> guests;
};

enum class Ev : uint8_t { kArrive, kFinish, kReleased, kRetry };

struct Event {
  double t;
  uint64_t seq;
  Ev type;
  int job;
  uint64_t version;
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

int ClassIndex(JobClass c) { return static_cast<int>(c); }

class Sim {
 public:
  Sim(const std::vector<JobSpec>& specs, const std::vector<StepProfile>& profiles, SimPolicy policy,
      const SimOptions& o)
      : profiles_(profiles), kind_(policy), o_(o), w0_(o.warmup_s), w1_(o.warmup_s + o.window_s) {
    jobs_.resize(specs.size());
    view_pos_.assign(specs.size(), -1);
    for (size_t i = 0; i < specs.size(); ++i) {
      jobs_[i].spec = &specs[i];
      Push(specs[i].arrival_s, Ev::kArrive, static_cast<int>(i), 0);
    }
  }

  // The policy decides on the simulator's clock (simulated time).
  absl::Status Init() {
    absl::StatusOr<std::unique_ptr<Policy>> rules = Policy::Create(o_.policy, &clock_);
    if (!rules.ok()) return rules.status();
    rules_ = *std::move(rules);
    return absl::OkStatus();
  }

  SimResult Run() {
    const double stop = w1_ + o_.drain_s;
    double now = 0;
    while (!events_.empty()) {
      const Event e = events_.top();
      if (e.t > stop) break;
      events_.pop();
      AdvanceTo(e.t);
      now = e.t;
      ++r_.events;
      Job& j = jobs_[e.job];
      switch (e.type) {
        case Ev::kArrive:
          j.st = St::kQueued;
          Enqueue(e.job);
          break;
        case Ev::kFinish:
          if (e.version != j.version) continue;
          Finish(e.job, now);
          break;
        case Ev::kReleased:
          if (e.version != j.version || j.st != St::kSaving) continue;
          StopHolding(e.job, now);
          saving_devices_ -= j.spec->devices;
          j.st = St::kQueued;
          Enqueue(e.job);
          break;
        case Ev::kRetry:
          break;  // Schedule asks the policy again (retry_at_ has passed)
      }
      Schedule(now);
    }
    const double end = std::min(stop, std::max(now, w1_));
    AdvanceTo(end);
    for (size_t i = 0; i < jobs_.size(); ++i) {
      Sync(static_cast<int>(i), end);
      if (jobs_[i].st == St::kRunning || jobs_[i].st == St::kSaving) {
        r_.held_by_jobs_device_s += jobs_[i].spec->devices * Overlap(jobs_[i].held_since, end);
      }
    }
    return Summarize();
  }

 private:
  // ---------------------------------------------------------- bookkeeping
  void Push(double t, Ev type, int job, uint64_t version) {
    events_.push({t, seq_++, type, job, version});
  }
  double Overlap(double a, double b) const {
    return std::max(0.0, std::min(b, w1_) - std::max(a, w0_));
  }
  void AdvanceTo(double t) {
    const double ov = Overlap(last_t_, t);
    r_.held_device_s += used_ * ov;
    r_.free_device_s += (o_.devices - used_) * ov;
    last_t_ = std::max(last_t_, t);
  }
  const StepProfile& Prof(int j) const { return profiles_[jobs_[j].spec->profile]; }
  double Busy(int j) const { return jobs_[j].spec->devices * (1.0 - Prof(j).idle_fraction); }
  void Sync(int ji, double now) {
    Job& j = jobs_[ji];
    if (j.rate > 0 && now > j.updated) {
      const double ov = Overlap(j.updated, now);
      j.progress += j.rate * (now - j.updated);
      if (j.st == St::kGuest) {
        r_.harvested_device_s += Busy(ji) * j.rate * ov;
      } else {
        r_.useful_device_s += Busy(ji) * j.rate * ov;
      }
    }
    j.updated = now;
  }
  void SetRate(int ji, double now, double rate) {
    Sync(ji, now);
    Job& j = jobs_[ji];
    j.rate = rate;
    ++j.version;
    if (rate > 0) {
      Push(now + std::max(0.0, j.spec->work_s - j.progress) / rate, Ev::kFinish, ji, j.version);
    }
  }
  void Enqueue(int ji) {
    const JobSpec& s = *jobs_[ji].spec;
    queue_[ClassIndex(s.job_class)][s.devices].insert({s.id, ji});
  }
  void Dequeue(int ji) {
    const JobSpec& s = *jobs_[ji].spec;
    auto& q = queue_[ClassIndex(s.job_class)][s.devices];
    q.erase({s.id, ji});
    if (q.empty()) queue_[ClassIndex(s.job_class)].erase(s.devices);
  }
  // The earliest queued job of class c with at most `max_devices` (-1: any).
  int Head(int c, int max_devices) const {
    int best = -1;
    uint64_t best_id = 0;
    for (const auto& [size, q] : queue_[c]) {
      if (max_devices >= 0 && size > max_devices) break;
      if (q.empty()) continue;
      if (best < 0 || q.begin()->first < best_id) {
        best = q.begin()->second;
        best_id = q.begin()->first;
      }
    }
    return best;
  }
  int Free() const { return o_.devices - used_; }

  // --------------------------------------------------------------- owners
  void StartOwner(int ji, double now) {
    Dequeue(ji);
    Job& j = jobs_[ji];
    j.st = St::kRunning;
    used_ += j.spec->devices;
    j.held_since = now;
    j.run_start = now;
    j.run_start_progress = j.progress;
    j.updated = now;
    SetRate(ji, now, 1.0);
    if (j.spec->job_class == JobClass::kCritical) {
      if (kind_ == SimPolicy::kColocate) Rebucket(ji);
    } else {
      AddNoncritical(ji);
    }
  }
  std::tuple<int, double, int> KillKey(int ji) const {
    return {-ClassIndex(jobs_[ji].spec->job_class), -jobs_[ji].run_start, ji};
  }
  void AddNoncritical(int ji) {
    const Job& j = jobs_[ji];
    JobView v;
    v.id = static_cast<uint64_t>(ji);
    v.job_class = j.spec->job_class;
    v.devices = j.spec->devices;
    v.running_since_ns = Ns(j.run_start);
    v.last_checkpoint_ns = v.running_since_ns;
    v.bounds = {Ns(o_.step_s), Ns(o_.save_s)};
    view_pos_[ji] = static_cast<int>(views_.size());
    views_.push_back(v);
    kill_order_.insert(KillKey(ji));
    noncritical_devices_ += j.spec->devices;
  }
  void RemoveNoncritical(int ji) {
    const int pos = view_pos_[ji];
    if (pos < 0) return;
    views_[pos] = views_.back();
    view_pos_[static_cast<int>(views_[pos].id)] = pos;
    views_.pop_back();
    view_pos_[ji] = -1;
    kill_order_.erase(KillKey(ji));
    noncritical_devices_ -= jobs_[ji].spec->devices;
  }
  void StopHolding(int ji, double now) {
    Job& j = jobs_[ji];
    r_.held_by_jobs_device_s += j.spec->devices * Overlap(j.held_since, now);
    used_ -= j.spec->devices;
  }
  double CheckpointProgress(const Job& j, double now) const {
    const double C = o_.checkpoint_period_s;
    const double saved_wall = C > 0 ? std::floor((now - j.run_start) / C) * C : 0;
    return std::min(j.progress, j.run_start_progress + saved_wall);  // rate 1 while dedicated
  }
  void Kill(int ji, double now) {
    Sync(ji, now);
    Job& j = jobs_[ji];
    const double keep = CheckpointProgress(j, now);
    const double lost = j.progress - keep;
    if (now >= w0_ && now < w1_) {
      lost_device_s_ += j.spec->devices * lost;
      r_.useful_device_s -= Busy(ji) * lost;
    }
    j.progress = keep;
    ++j.preemptions;
    ++r_.preemptions;
    RemoveNoncritical(ji);
    StopHolding(ji, now);
    j.rate = 0;
    ++j.version;
    j.st = St::kQueued;
    Enqueue(ji);
  }
  void SaveAndRelease(int ji, double now, double release_at) {
    Job& j = jobs_[ji];
    SetRate(ji, now, 0.0);
    ++j.preemptions;
    ++r_.preemptions;
    RemoveNoncritical(ji);
    j.st = St::kSaving;
    saving_devices_ += j.spec->devices;
    Push(release_at, Ev::kReleased, ji, j.version);
  }
  void Finish(int ji, double now) {
    Sync(ji, now);
    Job& j = jobs_[ji];
    j.completion = now;
    if (j.st == St::kGuest) {
      Detach(ji, now);
    } else {
      StopHolding(ji, now);
      RemoveNoncritical(ji);
      for (int g : j.guests) {  // the host is done: its guests save and queue again
        Sync(g, now);
        jobs_[g].rate = 0;
        ++jobs_[g].version;
        jobs_[g].host = -1;
        jobs_[g].st = St::kQueued;
        Enqueue(g);
      }
      j.guests.clear();
      j.guest_devices = 0;
      Unbucket(ji);
    }
    j.st = St::kDone;
    j.rate = 0;
    ++j.version;
  }

  // --------------------------------------------------------------- guests
  int Slots(int host) const { return jobs_[host].spec->devices - jobs_[host].guest_devices; }
  void Unbucket(int host) {
    for (auto& b : hosts_by_slots_) b.erase(host);
  }
  void Rebucket(int host) {
    Unbucket(host);
    const StepProfile& p = Prof(host);
    if (p.harvest_fraction * p.idle_fraction <= 0 || jobs_[host].st != St::kRunning) return;
    const int s = std::min(Slots(host), 8);
    if (s > 0) hosts_by_slots_[s].insert(host);
  }
  int FindHost(int devices) const {
    for (int s = std::max(devices, 1); s <= 8; ++s) {
      if (!hosts_by_slots_[s].empty()) return *hosts_by_slots_[s].begin();
    }
    return -1;
  }
  void Attach(int gi, int host, double now) {
    Dequeue(gi);
    Job& g = jobs_[gi];
    Job& h = jobs_[host];
    g.st = St::kGuest;
    g.host = host;
    g.updated = now;
    const StepProfile& hp = Prof(host);
    SetRate(gi, now, hp.harvest_fraction * hp.idle_fraction);
    h.guests.push_back(gi);
    h.guest_devices += g.spec->devices;
    if (h.guests.size() == 1) SetRate(host, now, 1.0 / (1.0 + hp.host_slowdown));
    Rebucket(host);
    ++r_.guest_attaches;
  }
  void Detach(int gi, double now) {
    Job& g = jobs_[gi];
    const int host = g.host;
    Job& h = jobs_[host];
    h.guests.erase(std::find(h.guests.begin(), h.guests.end(), gi));
    h.guest_devices -= g.spec->devices;
    if (h.guests.empty()) SetRate(host, now, 1.0);
    g.host = -1;
    Rebucket(host);
  }

  // ------------------------------------------------------------ decisions
  // Frees devices for the critical job `ci` by the policy; returns whether
  // it may start now.
  bool MakeRoom(int ci, double now) {
    const int need = jobs_[ci].spec->devices;
    if (kind_ == SimPolicy::kStatic) return false;
    if (kind_ == SimPolicy::kKillRequeue) {
      if (Free() + noncritical_devices_ < need) return false;
      // Best-effort first, then regular; the youngest run first (kill_order_).
      while (Free() < need) Kill(std::get<2>(*kill_order_.begin()), now);
      return true;
    }
    // kColocate: the policy's victims, with its notices.
    const int missing = need - Free() - saving_devices_;
    if (missing <= 0) return false;  // saves under way free enough
    // After a refusal, nothing non-critical starts while this job waits, so
    // the preemptible devices only shrink until a min_run passes (the
    // retry), and the shortfall only closes by as much as devices come free.
    if (blocked_ == ci && (!retry_pending_ || now < retry_at_) &&
        Free() + saving_devices_ - blocked_free_ < blocked_deficit_) {
      return false;
    }
    const int64_t now_ns = Ns(now);
    clock_.Set(now_ns);
    const int64_t period_ns = Ns(o_.checkpoint_period_s);
    int preemptible = 0;
    for (JobView& v : views_) {  // the periodic saves since the last call
      if (period_ns > 0) {
        v.last_checkpoint_ns =
            v.running_since_ns + (now_ns - v.running_since_ns) / period_ns * period_ns;
      }
      if (rules_->Preemptible(v)) preemptible += v.devices;
    }
    const std::vector<JobView>& views = views_;
    absl::StatusOr<colocate::Victims> victims = rules_->ChooseVictims(views, missing, Ns(now));
    if (!victims.ok()) {
      std::optional<int64_t> next = rules_->NextPreemptible(views);
      blocked_ = ci;
      blocked_free_ = Free() + saving_devices_;
      blocked_deficit_ = missing - preemptible;
      retry_pending_ = false;
      if (next.has_value()) {
        retry_pending_ = true;
        retry_at_ = static_cast<double>(*next) / 1e9;
        Push(retry_at_, Ev::kRetry, ci, 0);
      }
      return false;
    }
    for (size_t k = 0; k < victims->ids.size(); ++k) {
      const int ji = static_cast<int>(victims->ids[k]);
      if (victims->notices[k].kind == NoticeKind::kNowWithoutSave) {
        Kill(ji, now);
      } else {
        // It finishes the step in flight (half a step on average) and saves.
        SaveAndRelease(ji, now, now + 0.5 * o_.step_s + o_.save_s);
      }
    }
    return Free() >= need;
  }

  void Schedule(double now) {
    int reserve = 0;
    const int crit = ClassIndex(JobClass::kCritical);
    for (;;) {
      const int ci = Head(crit, -1);
      if (ci < 0) break;
      if (jobs_[ci].spec->devices <= Free() || MakeRoom(ci, now)) {
        StartOwner(ci, now);
        continue;
      }
      reserve = jobs_[ci].spec->devices;  // nothing else starts on its devices
      break;
    }
    for (JobClass c : {JobClass::kRegular, JobClass::kBestEffort}) {
      for (;;) {
        const int avail = Free() - reserve;
        if (avail <= 0) break;
        const int ji = Head(ClassIndex(c), avail);
        if (ji < 0) break;
        StartOwner(ji, now);
      }
    }
    if (kind_ != SimPolicy::kColocate) return;
    // Best-effort jobs still queued run as guests in critical jobs' windows.
    const int be = ClassIndex(JobClass::kBestEffort);
    for (int size = 1; size <= 8; ++size) {
      for (;;) {
        auto it = queue_[be].find(size);
        if (it == queue_[be].end() || it->second.empty()) break;
        const int host = FindHost(size);
        if (host < 0) break;
        Attach(it->second.begin()->second, host, now);
      }
    }
  }

  static int64_t Ns(double s) { return static_cast<int64_t>(std::llround(s * 1e9)); }

  SimResult Summarize() {
    double crit_slow = 0;
    int64_t crit_n = 0;
    double reg_jct = 0;
    int64_t reg_n = 0;
    for (const Job& j : jobs_) {
      const JobSpec& s = *j.spec;
      if (s.arrival_s < w0_ || s.arrival_s >= w1_) continue;
      const int c = ClassIndex(s.job_class);
      ++r_.jobs_measured[c];
      if (s.job_class == JobClass::kRegular && j.preemptions >= o_.starve_preemptions) ++r_.starved;
      if (j.completion < 0) continue;
      ++r_.jobs_completed[c];
      const double jct = j.completion - s.arrival_s;
      if (s.job_class == JobClass::kCritical) {
        crit_slow += std::max(0.0, jct - s.work_s) / s.work_s;  // not below 0 by rounding
        ++crit_n;
      } else if (s.job_class == JobClass::kRegular) {
        reg_jct += jct;
        ++reg_n;
      }
    }
    r_.capacity_device_s = static_cast<double>(o_.devices) * o_.window_s;
    r_.utilization = (r_.useful_device_s + r_.harvested_device_s) / r_.capacity_device_s;
    r_.critical_slowdown_pct = crit_n > 0 ? 100.0 * crit_slow / crit_n : 0;
    r_.regular_jct_h = reg_n > 0 ? reg_jct / reg_n / 3600.0 : 0;
    r_.lost_work_h = lost_device_s_ / 3600.0;
    return r_;
  }

  const std::vector<StepProfile>& profiles_;
  SimPolicy kind_;
  SimOptions o_;
  FakeClock clock_{0};
  std::unique_ptr<Policy> rules_;
  double w0_;
  double w1_;
  std::vector<Job> jobs_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t seq_ = 0;
  double last_t_ = 0;
  int used_ = 0;
  int saving_devices_ = 0;
  // Per class, per size: (job id, index) in arrival order.
  std::map<int, std::set<std::pair<uint64_t, int>>> queue_[3];
  // Running regular and best-effort owners, as the policy sees them
  // (contiguous: the policy reads them all at each decision).
  std::vector<JobView> views_;
  std::vector<int> view_pos_;                          // by job: index in views_, -1 when not there
  std::set<std::tuple<int, double, int>> kill_order_;  // the same, in kill-and-requeue's order
  int noncritical_devices_ = 0;
  std::set<int> hosts_by_slots_[9];  // critical hosts by free guest slots (capped at 8)
  bool retry_pending_ = false;
  double retry_at_ = 0;
  int blocked_ = -1;
  int blocked_free_ = 0;     // free + saving devices at the refusal
  int blocked_deficit_ = 0;  // devices missing beyond the preemptible ones then
  double lost_device_s_ = 0;
  SimResult r_;
};

}  // namespace

absl::StatusOr<SimResult> Simulate(const std::vector<JobSpec>& jobs,
                                   const std::vector<StepProfile>& profiles, SimPolicy policy,
                                   const SimOptions& options) {
  if (options.devices <= 0 || options.window_s <= 0) {
    return absl::InvalidArgumentError("cluster sim: devices and window_s must be positive");
  }
  for (const JobSpec& j : jobs) {
    if (j.devices < 1 || j.devices > options.devices) {
      return absl::InvalidArgumentError(absl::StrCat("cluster sim: job ", j.id, " needs ",
                                                     j.devices, " devices of ", options.devices));
    }
    if (j.profile < 0 || j.profile >= static_cast<int>(profiles.size())) {
      return absl::InvalidArgumentError(absl::StrCat("cluster sim: job ", j.id, " has profile ",
                                                     j.profile, " of ", profiles.size()));
    }
  }
  Sim sim(jobs, profiles, policy, options);
  if (absl::Status st = sim.Init(); !st.ok()) return st;
  return sim.Run();
}

}  // namespace omni::clustersim
