#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "omni/forecast.h"

namespace omni {

double PipelineBubbleFraction(int stages, int micro_batches) {
  if (stages < 1 || micro_batches < 1) return 0;
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

namespace {

absl::Status CheckEvent(const PeriodicEvent& e, const char* name) {
  if (e.every_steps < 0 || e.offset < 0 || e.expected_ns < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": every_steps, offset and expected_ns must not be negative"));
  }
  if (e.every_steps > 0 && e.offset >= e.every_steps) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": offset ", e.offset, " must be below every_steps ", e.every_steps));
  }
  return absl::OkStatus();
}

// One piece of a predicted step: busy or idle, with a mean and variance.
struct Piece {
  double mean = 0;
  double var = 0;
  IdleKind kind = IdleKind::kNone;
};

struct StepPlan {
  std::vector<Piece> pieces;
  double step_mean = 0;
  double step_var = 0;
  double level_sd = 0;  // uncertainty of step_mean itself
  double max_idle = 0;  // longest idle piece
};

void AddPiece(StepPlan& plan, double mean, double var, IdleKind kind) {
  if (mean <= 0) return;
  plan.pieces.push_back(Piece{mean, std::max(var, 0.0), kind});
  if (kind != IdleKind::kNone) plan.max_idle = std::max(plan.max_idle, mean);
}

// Splits a compute segment of the given length into the GPipe schedule of
// one stage (see PipelineSchedule).
void AddPipelinePieces(StepPlan& plan, const PipelineSchedule& ps, double mean, double var) {
  const double p = ps.stages, m = ps.micro_batches, r = ps.stage;
  const double tf = mean / ((m + p - 1) * (1 + ps.backward_over_forward));
  const double tb = tf * ps.backward_over_forward;
  const double lens[5] = {r * tf, m * tf, (p - 1 - r) * (tf + tb), m * tb, r * tb};
  const IdleKind kinds[5] = {IdleKind::kPipelineBubble, IdleKind::kNone, IdleKind::kPipelineBubble,
                             IdleKind::kNone, IdleKind::kPipelineBubble};
  for (int i = 0; i < 5; ++i)
    AddPiece(plan, lens[i], mean > 0 ? var * lens[i] / mean : 0, kinds[i]);
}

StepPlan BuildPlan(const StepStats& stats, const ForecastOptions& opt, StepKind kind) {
  StepPlan plan;
  const RollingWindow& own = stats.steps(kind);
  const bool measured = !own.empty() && !stats.shape(kind).empty();
  const std::vector<PhaseId>& shape = measured ? stats.shape(kind) : stats.shape(StepKind::kNormal);
  const RollingWindow& normal = stats.steps(StepKind::kNormal);
  const PhaseCatalog& cat = stats.catalog();
  for (const PhaseId ph : shape) {
    const RollingWindow& tot = stats.segment_total(ph);
    const RollingWindow& idle = stats.segment_idle(ph);
    const double tmean = tot.mean(), tsd = tot.stddev();
    const double imean = std::min(idle.mean(), tmean), isd = idle.stddev();
    if (ph == phase::kCompute && opt.pipeline.stages > 1) {
      AddPipelinePieces(plan, opt.pipeline, tmean, tsd * tsd);
      continue;
    }
    IdleKind ik = cat.idle_kind(ph);
    if (ik == IdleKind::kNone) ik = stats.segment_idle_kind(ph);
    // Busy part first, the phase's own idle time at its end (e.g. an eval's
    // forward pass, then host-side scoring).
    AddPiece(plan, tmean - imean, std::max(tsd * tsd - isd * isd, 0.0), IdleKind::kNone);
    AddPiece(plan, imean, isd * isd, ik);
  }
  AddPiece(plan, stats.uncovered().mean(), std::pow(stats.uncovered().stddev(), 2),
           IdleKind::kHostSide);
  const auto level = [&](const RollingWindow& w) {
    const int n = std::min(opt.level_window, w.size());
    plan.step_mean = w.RecentMean(n);
    plan.step_var = w.stddev() * w.stddev();
    const double drift = plan.step_mean - w.mean();
    plan.level_sd = std::sqrt(drift * drift + plan.step_var / std::max(n, 1));
  };
  if (measured) {
    level(own);
    return plan;
  }
  level(normal);
  // An event step not yet measured: the declared duration, with a 10%
  // standard deviation, appended to a normal step.
  const PeriodicEvent& ev = kind == StepKind::kCheckpoint ? opt.checkpoint : opt.eval;
  if (kind != StepKind::kNormal && ev.expected_ns > 0) {
    const auto e = static_cast<double>(ev.expected_ns);
    AddPiece(plan, e, 0.01 * e * e,
             kind == StepKind::kCheckpoint ? IdleKind::kCheckpoint : IdleKind::kEval);
    plan.step_mean += e;
    plan.step_var += 0.01 * e * e;
  }
  return plan;
}

StepKind KindAt(const ForecastOptions& opt, int64_t step) {
  if (opt.checkpoint.OccursAt(step)) return StepKind::kCheckpoint;
  if (opt.eval.OccursAt(step)) return StepKind::kEval;
  return StepKind::kNormal;
}

// The first step >= `from` at which `e` occurs (max int64 when never).
int64_t NextOccurrence(const PeriodicEvent& e, int64_t from) {
  if (e.every_steps <= 0) return std::numeric_limits<int64_t>::max();
  const int64_t base = from - from % e.every_steps + e.offset;
  return base >= from ? base : base + e.every_steps;
}

}  // namespace

absl::Status ValidateForecastOptions(const ForecastOptions& o) {
  if (o.horizon_ns <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("forecast horizon must be positive, got ", o.horizon_ns, " ns"));
  }
  if (!std::isfinite(o.k) || o.k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("forecast k must be finite and >= 0, got ", o.k));
  }
  if (o.min_window_ns < 0) {
    return absl::InvalidArgumentError("forecast min_window must not be negative");
  }
  if (o.level_window <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("forecast level_window must be positive, got ", o.level_window));
  }
  if (o.max_windows <= 0) {
    return absl::InvalidArgumentError("forecast max_windows must be positive");
  }
  if (auto st = CheckEvent(o.checkpoint, "checkpoint event"); !st.ok()) return st;
  if (auto st = CheckEvent(o.eval, "eval event"); !st.ok()) return st;
  const PipelineSchedule& p = o.pipeline;
  if (p.stages < 1 || p.micro_batches < 1) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline stages (", p.stages,
                                                   ") and micro_batches (", p.micro_batches,
                                                   ") must be at least 1"));
  }
  if (p.stage < 0 || p.stage >= p.stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline stage ", p.stage, " is outside [0, ", p.stages, ")"));
  }
  if (!std::isfinite(p.backward_over_forward) || p.backward_over_forward < 0) {
    return absl::InvalidArgumentError("pipeline backward_over_forward must be finite and >= 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<Forecaster> Forecaster::Create(const ForecastOptions& options) {
  if (auto st = ValidateForecastOptions(options); !st.ok()) return st;
  return Forecaster(options);
}

absl::StatusOr<Forecast> Forecaster::Predict(const StepStats& stats, int64_t now_ns) const {
  if (stats.steps(StepKind::kNormal).empty() || stats.shape(StepKind::kNormal).empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no forecast yet: ", stats.steps_seen(), " steps seen, ",
                     stats.warming_up() ? "still warming up" : "no normal step measured"));
  }
  const ForecastOptions& opt = options_;
  const double k = opt.k;
  std::array<StepPlan, kNumStepKinds> plans;
  for (int i = 0; i < kNumStepKinds; ++i)
    plans[i] = BuildPlan(stats, opt, static_cast<StepKind>(i));

  Forecast f;
  f.made_at_ns = now_ns;
  f.horizon_ns = opt.horizon_ns;
  f.last_step = stats.last_step();
  f.steps_observed = stats.steps(StepKind::kNormal).size() +
                     stats.steps(StepKind::kCheckpoint).size() +
                     stats.steps(StepKind::kEval).size();
  f.k = k;
  const double confidence = std::erf(k / std::sqrt(2.0));  // 1 - 2(1 - Phi(k))
  const auto horizon_end = static_cast<double>(now_ns) + static_cast<double>(opt.horizon_ns);
  const auto now = static_cast<double>(now_ns);
  const auto min_window = static_cast<double>(opt.min_window_ns);

  double t = static_cast<double>(stats.last_end_ns());  // mean start of the next step
  double var = 0;                                       // its random variance
  double level = 0;  // accumulated level uncertainty (adds linearly)
  bool need_known = false;
  int64_t step = stats.last_step() + 1;
  while (t < horizon_end && static_cast<int>(f.windows.size()) < opt.max_windows) {
    const StepKind kind = KindAt(opt, step);
    const StepPlan& plan = plans[static_cast<int>(kind)];
    if (plan.step_mean <= 0) break;  // zero-length steps: nothing to place
    double pt = t, pv = var + level * level;
    for (const Piece& pc : plan.pieces) {
      const double end_t = pt + pc.mean, end_v = pv + pc.var;
      if (pc.kind == IdleKind::kNone) {
        if (!need_known && end_t > now) {
          f.devices_needed_at_ns = static_cast<int64_t>(std::max(now, pt - k * std::sqrt(pv)));
          need_known = true;
        }
      } else {
        double ws = pt + k * std::sqrt(pv);
        const double we = std::min(end_t - k * std::sqrt(end_v), horizon_end);
        ws = std::max(ws, now);
        if (we - ws >= min_window && we - ws > 0) {
          f.windows.push_back(IdleWindow{static_cast<int64_t>(ws), static_cast<int64_t>(we - ws),
                                         pc.kind, confidence, step});
          if (static_cast<int>(f.windows.size()) >= opt.max_windows) break;
        }
      }
      pt = end_t;
      pv = end_v;
    }
    t += plan.step_mean;
    var += plan.step_var;
    level += plan.level_sd;
    ++step;
    // Once the accumulated uncertainty is wider than any idle piece of a
    // normal step, none can be published any more: jump to the next event
    // step (or stop when those cannot be published either).
    const double spread = 2 * k * std::sqrt(var + level * level);
    const StepPlan& normal = plans[0];
    if (k > 0 && spread > normal.max_idle && normal.step_mean > 0) {
      const double event_idle = std::max(plans[1].max_idle, plans[2].max_idle);
      if (spread > event_idle) break;
      const int64_t next =
          std::min(NextOccurrence(opt.checkpoint, step), NextOccurrence(opt.eval, step));
      if (next == std::numeric_limits<int64_t>::max()) break;
      const auto skip = static_cast<double>(next - step);
      t += skip * normal.step_mean;
      var += skip * normal.step_var;
      level += skip * normal.level_sd;
      step = next;
    }
  }
  if (!need_known) f.devices_needed_at_ns = static_cast<int64_t>(std::min(t, horizon_end));
  return f;
}

absl::StatusOr<FitCheck> Forecaster::FitsBefore(const GuestCost& g, int64_t now_ns,
                                                int64_t deadline_ns) const {
  for (const double v : {g.step_mean_ns, g.step_stddev_ns, g.save_mean_ns, g.save_stddev_ns}) {
    if (!std::isfinite(v) || v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("guest cost must be finite and >= 0, got ", v));
    }
  }
  FitCheck c;
  const double need = g.step_mean_ns + g.save_mean_ns +
                      options_.k * std::sqrt(g.step_stddev_ns * g.step_stddev_ns +
                                             g.save_stddev_ns * g.save_stddev_ns);
  c.needed_ns = static_cast<int64_t>(std::ceil(need));
  c.available_ns = deadline_ns - now_ns;
  c.fits = c.needed_ns <= c.available_ns;
  return c;
}

int64_t Forecast::total_idle_ns() const {
  int64_t sum = 0;
  for (const IdleWindow& w : windows) sum += w.duration_ns;
  return sum;
}

const IdleWindow* Forecast::WindowAt(int64_t t_ns) const {
  auto it = std::upper_bound(windows.begin(), windows.end(), t_ns,
                             [](int64_t t, const IdleWindow& w) { return t < w.start_ns; });
  if (it == windows.begin()) return nullptr;
  --it;
  return t_ns < it->start_ns + it->duration_ns ? &*it : nullptr;
}

}  // namespace omni
