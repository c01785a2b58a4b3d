#include "tracegen_scenarios.h"

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "omni/step_log.h"

namespace omni::tracegen {

namespace {

constexpr int64_t kMs = 1'000'000;

int64_t Ms(double ms) { return static_cast<int64_t>(std::llround(ms * 1e6)); }

// Random draws shared by the scenarios.
struct Noise {
  std::mt19937_64 rng;
  explicit Noise(uint64_t seed) : rng(seed) {}
  // A lognormal around `median_ms` with shape sigma.
  double LogN(double median_ms, double sigma) {
    return std::lognormal_distribution<double>(std::log(median_ms), sigma)(rng);
  }
  // `ms` with a relative Gaussian jitter (never below 10% of ms).
  double Jit(double ms, double rel) {
    return std::max(0.1 * ms, ms * std::normal_distribution<double>(1.0, rel)(rng));
  }
  bool Chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }
};

// Builds one step: phases appended back to back from the step's start.
class StepBuilder {
 public:
  StepBuilder(int64_t step, int64_t start_ns) : c_(start_ns) {
    rec_.step = step;
    rec_.start_ns = start_ns;
  }
  // Appends a top-level phase of `ms`; returns its span index.
  int Phase(PhaseId phase, double ms) {
    const int i = Span(phase, c_, c_ + Ms(ms), 0);
    c_ += Ms(ms);
    return i;
  }
  // A nested phase at [offset, offset + ms) inside span `parent`.
  void Nested(int parent, PhaseId phase, double offset_ms, double ms) {
    const int64_t a = rec_.spans[parent].start_ns + Ms(offset_ms);
    Span(phase, a, a + Ms(ms), rec_.spans[parent].depth + 1);
  }
  StepRecord Finish() {
    rec_.end_ns = c_;
    return rec_;
  }
  int64_t now() const { return c_; }

 private:
  int Span(PhaseId phase, int64_t a, int64_t b, int depth) {
    PhaseSpan& s = rec_.spans[rec_.num_spans];
    s.phase = phase;
    s.start_ns = a;
    s.end_ns = b;
    s.depth = static_cast<uint8_t>(depth);
    return rec_.num_spans++;
  }
  StepRecord rec_;
  int64_t c_;
};

// A generator: header tweaks, then one step at a time (nullopt = not logged).
struct Scenario {
  std::function<void(StepLogHeader&)> header;
  // Returns the step; `t` is its start (the previous step's end plus the gap).
  std::function<StepRecord(Noise&, int64_t step, int64_t t, const StepLogHeader&)> step;
  int log_every = 1;
  double gap_ms = 0.05;
};

// A plain training step: data wait, compute, comm, optimizer; a rare
// host-side pause (GC, logging) of 20-80 ms.
StepRecord Plain(Noise& n, int64_t s, int64_t t, double data_median, double data_sigma,
                 double compute_ms) {
  StepBuilder b(s, t);
  b.Phase(phase::kDataWait, n.LogN(data_median, data_sigma));
  b.Phase(phase::kCompute, n.Jit(compute_ms, 0.02));
  b.Phase(phase::kComm, n.Jit(0.08 * compute_ms, 0.05));
  b.Phase(phase::kOptimizer, n.Jit(0.05 * compute_ms, 0.03));
  if (n.Chance(0.01)) b.Phase(phase::kHost, n.LogN(40, 0.4));
  return b.Finish();
}

// Eval every 20 steps (offset 19): a 150 ms forward pass nested in 600 ms of
// host-side scoring; checkpoint every 35 (offset 34), ~800 ms (both at 139).
StepRecord Periodic(Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
  StepRecord r = Plain(n, s, t, 10, 0.3, 200);
  if (s % 20 != 19 && s % 35 != 34) return r;
  // Re-build with the event appended after the optimizer.
  StepBuilder e(s, t);
  for (int i = 0; i < r.num_spans; ++i) {
    e.Phase(r.spans[i].phase, static_cast<double>(r.spans[i].end_ns - r.spans[i].start_ns) / 1e6);
  }
  if (s % 20 == 19) {
    const double fwd = n.Jit(150, 0.03);
    const int ev = e.Phase(phase::kEval, fwd + n.Jit(450, 0.05));
    e.Nested(ev, phase::kCompute, 0, fwd);
  }
  if (s % 35 == 34) e.Phase(phase::kCheckpoint, n.LogN(800, 0.08));
  return e.Finish();
}

// What a held-out scenario carries from step to step (a level with memory,
// a Markov state, the time of the last checkpoint).
struct Memory {
  double level = 0;
  bool bad = false;
  int64_t last_ckpt_ns = -1;
};

// Appends an eval (a `fwd_ms` forward pass nested in `total_ms` of eval)
// after the step's phases when `eval`, and a checkpoint of `ckpt_ms` when
// `ckpt_ms` > 0.
StepRecord WithEvents(const StepRecord& r, Noise& n, bool eval, double fwd_ms, double total_ms,
                      double ckpt_ms) {
  if (!eval && ckpt_ms <= 0) return r;
  StepBuilder e(r.step, r.start_ns);
  for (int i = 0; i < r.num_spans; ++i) {
    if (r.spans[i].depth != 0) continue;
    e.Phase(r.spans[i].phase, static_cast<double>(r.spans[i].end_ns - r.spans[i].start_ns) / 1e6);
  }
  if (eval) {
    const double fwd = n.Jit(fwd_ms, 0.03);
    const int ev = e.Phase(phase::kEval, fwd + n.Jit(total_ms - fwd_ms, 0.05));
    e.Nested(ev, phase::kCompute, 0, fwd);
  }
  if (ckpt_ms > 0) e.Phase(phase::kCheckpoint, ckpt_ms);
  return e.Finish();
}

// A data wait of `wait_ms`, then ~60 ms of compute and ~4 ms of optimizer.
StepRecord WaitThenWork(Noise& n, int64_t s, int64_t t, double wait_ms) {
  StepBuilder b(s, t);
  b.Phase(phase::kDataWait, wait_ms);
  b.Phase(phase::kCompute, n.Jit(60, 0.02));
  b.Phase(phase::kOptimizer, n.Jit(4, 0.04));
  return b.Finish();
}

// The held-out scenarios: written after the forecaster was tuned on the
// ones above, to check that what it states holds on behaviour it was not
// tuned on (tests/data/README.md).
void AddHeldOut(std::map<std::string, Scenario>& m) {
  // A sequence-length curriculum: compute grows 0.06% a step, with slow
  // contention (AR(1), φ 0.95, σ 1%); an undeclared eval every 100 steps.
  m["drift"] = {
      nullptr,
      [mem = std::make_shared<Memory>()](Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
        mem->level = 0.95 * mem->level + std::normal_distribution<double>(0, 0.01)(n.rng);
        const double compute = 150 * (1 + 0.0006 * static_cast<double>(s)) * std::exp(mem->level);
        return WithEvents(Plain(n, s, t, 6, 0.3, compute), n, s % 100 == 99, 40, 340, 0);
      }};
  // A shared cluster: compute slowed by contention that comes and goes
  // (AR(1), φ 0.9, σ 3%); an undeclared checkpoint every 50 steps (~500 ms).
  m["contention"] = {
      nullptr,
      [mem = std::make_shared<Memory>()](Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
        mem->level = 0.9 * mem->level + std::normal_distribution<double>(0, 0.03)(n.rng);
        const double compute = 100 * std::exp(mem->level);
        return WithEvents(Plain(n, s, t, 5, 0.3, compute), n, false, 0, 0,
                          s % 50 == 49 ? n.LogN(500, 0.1) : 0.0);
      }};
  // Data stalls in bursts: a loader that falls behind stays behind for a
  // while (enter 3% a step, leave 15%), stalling ~120 ms a step meanwhile.
  m["bursty_stalls"] = {nullptr, [mem = std::make_shared<Memory>()](Noise& n, int64_t s, int64_t t,
                                                                    const StepLogHeader&) {
                          mem->bad = mem->bad ? !n.Chance(0.15) : n.Chance(0.03);
                          StepBuilder b(s, t);
                          b.Phase(phase::kDataWait, mem->bad ? n.LogN(120, 0.3) : n.LogN(3, 0.3));
                          b.Phase(phase::kCompute, n.Jit(200, 0.02));
                          b.Phase(phase::kOptimizer, n.Jit(10, 0.03));
                          return b.Finish();
                        }};
  // Checkpoints by wall time (every 20 s of ~220 ms steps: the spacing in
  // steps wanders by one or two), and an eval every 100 steps, declared.
  m["time_ckpt"] = {
      [](StepLogHeader& h) {
        h.eval = PeriodicEvent{100, 99, 0};
      },
      [mem = std::make_shared<Memory>()](Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
        if (mem->last_ckpt_ns < 0) mem->last_ckpt_ns = t;
        const bool ckpt = t - mem->last_ckpt_ns >= 20'000 * kMs;
        if (ckpt) mem->last_ckpt_ns = t;
        return WithEvents(Plain(n, s, t, 8, 0.3, 190), n, s % 100 == 99, 50, 400,
                          ckpt ? n.LogN(700, 0.05) : 0.0);
      }};
  // A straggler: steps 250–349 run 1.8× slower (a throttled device), then
  // the job recovers.
  m["straggler"] = {nullptr, [](Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
                      const double compute = s >= 250 && s < 350 ? 1.8 * 160 : 160;
                      return Plain(n, s, t, 8, 0.3, compute);
                    }};
  // Every 5th step logged (offset 4) of a job whose loader stalls ~250 ms
  // every 4th step, with an undeclared eval every 40 steps.
  Scenario sampled5;
  sampled5.step = [](Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
    StepBuilder b(s, t);
    b.Phase(phase::kDataWait, s % 4 == 0 ? n.LogN(250, 0.08) : n.LogN(4, 0.3));
    b.Phase(phase::kCompute, n.Jit(400, 0.02));
    b.Phase(phase::kOptimizer, n.Jit(20, 0.03));
    return WithEvents(b.Finish(), n, s % 40 == 39, 60, 500, 0);
  };
  sampled5.log_every = 5;
  m["sampled5"] = sampled5;
  // Garbage-collection pauses: 3% of steps stop for 100–300 ms (host-side),
  // at random; an eval every 50 steps, declared.
  m["gc_pauses"] = {[](StepLogHeader& h) {
                      h.eval = PeriodicEvent{50, 49, 0};
                    },
                    [](Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
                      StepRecord r = Plain(n, s, t, 6, 0.3, 130);
                      if (n.Chance(0.03)) {
                        StepBuilder b(s, t);
                        for (int i = 0; i < r.num_spans; ++i) {
                          b.Phase(
                              r.spans[i].phase,
                              static_cast<double>(r.spans[i].end_ns - r.spans[i].start_ns) / 1e6);
                        }
                        b.Phase(phase::kHost, n.LogN(170, 0.3));
                        r = b.Finish();
                      }
                      return WithEvents(r, n, s % 50 == 49, 30, 250, 0);
                    }};
}

// Two behaviours a stress test of new step logs found the forecaster
// getting wrong (2026-12-02), kept as regression traces (tuned on since).
void AddRegressions(std::map<std::string, Scenario>& m) {
  // A loader whose refill rhythm changes: a ~300 ms stall every 3rd step
  // until step 750, every 5th from then on (a new shard size).
  m["rhythm_change"] = {nullptr, [](Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
                          const bool stall = s < 750 ? s % 3 == 2 : s % 5 == 4;
                          StepBuilder b(s, t);
                          b.Phase(phase::kDataWait, stall ? n.LogN(300, 0.08) : n.LogN(4, 0.25));
                          b.Phase(phase::kCompute, n.Jit(500, 0.02));
                          b.Phase(phase::kComm, n.Jit(20, 0.05));
                          b.Phase(phase::kOptimizer, n.Jit(10, 0.04));
                          return b.Finish();
                        }};
  // Events on a stall rhythm: a ~200 ms stall every 7th step, a declared
  // eval every 64 steps and an undeclared ~1.5 s checkpoint every 100, so
  // that some events fall on a stall step (eval 447, 895; checkpoint 699).
  m["events_on_rhythm"] = {[](StepLogHeader& h) {
                             h.eval = PeriodicEvent{64, 63, 0};
                           },
                           [](Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
                             StepBuilder b(s, t);
                             b.Phase(phase::kDataWait,
                                     s % 7 == 6 ? n.LogN(200, 0.08) : n.LogN(5, 0.25));
                             b.Phase(phase::kCompute, n.Jit(250, 0.02));
                             b.Phase(phase::kComm, n.Jit(15, 0.05));
                             b.Phase(phase::kOptimizer, n.Jit(8, 0.04));
                             return WithEvents(b.Finish(), n, s % 64 == 63, 250, 800,
                                               s % 100 == 99 ? n.LogN(1500, 0.06) : 0.0);
                           }};
  // Slow spells that pass (a noisy neighbour): steps 300-305 and 620-626 run
  // 2.2× slower, then as before. A ~150 ms stall every 10th step, an
  // undeclared eval every 40 (~150 ms forward pass, ~400 ms idle after it);
  // eval 519's idle part runs twice as long (a slow metrics upload).
  m["slow_spells"] = {
      nullptr, [](Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
        const bool spell = (s >= 300 && s < 306) || (s >= 620 && s < 627);
        const double slow = spell ? 2.2 : 1.0;
        StepBuilder b(s, t);
        b.Phase(phase::kDataWait, s % 10 == 0 ? n.LogN(150, 0.05) : n.LogN(2, 0.25));
        b.Phase(phase::kCompute, slow * n.Jit(200, 0.02));
        b.Phase(phase::kComm, slow * n.Jit(10, 0.05));
        b.Phase(phase::kOptimizer, slow * n.Jit(8, 0.04));
        const double idle = s == 519 ? 800 : 400;
        return WithEvents(b.Finish(), n, s % 40 == 39, 150 * slow, 150 * slow + idle * slow, 0.0);
      }};
  // Events rarer than the forecaster's history of 512 steps: an undeclared
  // eval every 300 steps (~100 ms forward pass, ~500 ms idle), an
  // undeclared ~2 s checkpoint every 700 (offset 649); from step 1500 the work
  // runs 1.3x slower (a new regime before the next events).
  m["rare_events"] = {nullptr, [](Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
                        StepBuilder b(s, t);
                        b.Phase(phase::kDataWait, n.LogN(5, 0.3));
                        b.Phase(phase::kCompute, (s < 1500 ? 1.0 : 1.3) * n.Jit(90, 0.02));
                        b.Phase(phase::kOptimizer, n.Jit(5, 0.04));
                        return WithEvents(b.Finish(), n, s % 300 == 299, 100, 600,
                                          s % 700 == 649 ? n.LogN(2000, 0.04) : 0.0);
                      }};
  // Waits of ~30 ms on 9 steps of 10 and ~2 ms on the tenth, at random (a
  // loader whose cache misses most batches): small claims that held hid
  // large ones that failed (2026-12-04).
  m["coin_waits"] = {nullptr, [](Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
                       return WaitThenWork(n, s, t,
                                           n.Chance(0.9) ? n.Jit(30, 0.05) : n.Jit(2, 0.05));
                     }};
  // A quick eval every 200 steps and a full one every 400, undeclared
  // (~100 ms forward pass, then ~150 ms or ~700 ms idle): lengths that
  // alternate by occurrence (2026-12-04).
  m["alternating_evals"] = {nullptr, [](Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
                              const bool full = s % 400 == 399;
                              return WithEvents(WaitThenWork(n, s, t, n.LogN(4, 0.3)), n,
                                                s % 200 == 199, 100, full ? 800 : 250, 0.0);
                            }};
  // A loader that falls behind through each epoch of 300 steps (waits
  // growing from ~1 to ~31 ms) and starts again at the next (2026-12-04).
  m["epoch_ramp"] = {nullptr, [](Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
                       return WaitThenWork(n, s, t,
                                           n.LogN(1 + 0.1 * static_cast<double>(s % 300), 0.15));
                     }};
  // An undeclared eval every 100 steps of 20 decode passes (~3 ms each,
  // ~1.5 ms idle between them) and ~40 ms idle after the last: more idle
  // stretches than the forecaster tells apart (2026-12-04).
  m["split_eval"] = {nullptr, [](Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
                       StepBuilder b(s, t);
                       b.Phase(phase::kDataWait, n.LogN(3, 0.4));
                       b.Phase(phase::kCompute, n.Jit(30, 0.03));
                       if (s % 100 != 99) return b.Finish();
                       std::vector<std::pair<double, double>> passes;  // (start, length)
                       double at = 0;
                       for (int k = 0; k < 20; ++k) {
                         passes.emplace_back(at, n.Jit(3, 0.1));
                         at += passes.back().second + n.Jit(1.5, 0.2);
                       }
                       const int ev = b.Phase(phase::kEval, at + n.Jit(40, 0.05));
                       for (const auto& [a, d] : passes) b.Nested(ev, phase::kCompute, a, d);
                       return b.Finish();
                     }};
  // An eval loop logged as steps of its own (a framework's step hook that
  // fires on validation batches too): 30 eval steps every 500 from step
  // 500, each a ~50 ms forward pass and ~30 ms idle after it, among
  // training steps of ~95 ms (2026-12-05).
  m["eval_loop"] = {nullptr, [](Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
                      StepBuilder b(s, t);
                      if (s >= 500 && s % 500 < 30) {
                        const double forward = n.Jit(50, 0.03);
                        const int ev = b.Phase(phase::kEval, forward + n.LogN(30, 0.1));
                        b.Nested(ev, phase::kCompute, 0, forward);
                        return b.Finish();
                      }
                      b.Phase(phase::kDataWait, n.LogN(4, 0.3));
                      b.Phase(phase::kCompute, n.Jit(90, 0.02));
                      return b.Finish();
                    }};
  // A loop that collates its batch and logs outside the step hooks: a
  // host-side gap before every step (~12 ms ± 5%) and a ~150 ms metrics
  // flush after every 100th, steps of ~70 ms with an undeclared ~400 ms
  // eval every 500 (2026-12-05).
  m["host_gaps"] = {nullptr, [](Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
                      const double gap = s % 100 == 1 ? n.Jit(150, 0.05) : n.Jit(12, 0.05);
                      StepBuilder b(s, t + Ms(gap));
                      b.Phase(phase::kCompute, n.Jit(60, 0.02));
                      b.Phase(phase::kOptimizer, n.Jit(8, 0.03));
                      if (s % 500 == 499) b.Phase(phase::kEval, n.Jit(400, 0.04));
                      return b.Finish();
                    }};
}

std::map<std::string, Scenario> Scenarios() {
  std::map<std::string, Scenario> m;
  m["steady"] = {nullptr, [](Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
                   return Plain(n, s, t, 8, 0.25, 120);
                 }};
  m["heavy_stalls"] = {nullptr, [](Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
                         return Plain(n, s, t, 15, 1.0, 150);
                       }};
  // A streaming loader refilling its buffer: every 3rd step waits ~400 ms.
  m["stall_every3"] = {nullptr, [](Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
                         StepBuilder b(s, t);
                         b.Phase(phase::kDataWait, s % 3 == 0 ? n.LogN(400, 0.08) : n.LogN(4, 0.3));
                         b.Phase(phase::kCompute, n.Jit(900, 0.02));
                         b.Phase(phase::kOptimizer, n.Jit(40, 0.03));
                         return b.Finish();
                       }};
  m["periodic_declared"] = {[](StepLogHeader& h) {
                              h.eval = PeriodicEvent{20, 19, 600 * kMs};
                              h.checkpoint = PeriodicEvent{35, 34, 800 * kMs};
                            },
                            Periodic};
  m["periodic_undeclared"] = {nullptr, Periodic};
  // Compile warm-up (60× the first step), then at step 120 a restart: a
  // 5 s gap, another 60× first step and a 30% slower regime.
  m["restart"] = {nullptr, [](Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
                    const double compute = s < 120 ? 200 : 260;
                    StepRecord r = Plain(n, s, t, 10, 0.3, compute);
                    if (s == 0 || s == 120) {
                      r.spans[1].end_ns += 60 * Ms(compute);
                      for (int i = 2; i < r.num_spans; ++i) {
                        r.spans[i].start_ns += 60 * Ms(compute);
                        r.spans[i].end_ns += 60 * Ms(compute);
                      }
                      r.end_ns += 60 * Ms(compute);
                    }
                    return r;
                  }};
  // Every 10th step logged (offset 9): stall every 3rd step, eval every 50.
  Scenario sampled;
  sampled.header = [](StepLogHeader& h) { h.eval = PeriodicEvent{50, 49, 0}; };
  sampled.step = [](Noise& n, int64_t s, int64_t t, const StepLogHeader&) {
    StepBuilder b(s, t);
    b.Phase(phase::kDataWait, s % 3 == 0 ? n.LogN(300, 0.08) : n.LogN(5, 0.3));
    b.Phase(phase::kCompute, n.Jit(550, 0.02));
    b.Phase(phase::kOptimizer, n.Jit(30, 0.03));
    if (s % 50 == 49) {
      const double fwd = n.Jit(120, 0.03);
      const int ev = b.Phase(phase::kEval, fwd + n.Jit(500, 0.05));
      b.Nested(ev, phase::kCompute, 0, fwd);
    }
    return b.Finish();
  };
  sampled.log_every = 10;
  m["sampled10"] = sampled;
  // RLHF: generation (busy) is short (~1.8 s) or long (~5.2 s) by the
  // prompts' answers, 30% long; then a remote reward service (host-side
  // idle, ~250 ms) and a training pass.
  m["rlhf_bimodal"] = {
      [](StepLogHeader& h) { h.phases.Register("generate", IdleKind::kNone).IgnoreError(); },
      [](Noise& n, int64_t s, int64_t t, const StepLogHeader& h) {
        StepBuilder b(s, t);
        b.Phase(phase::kDataWait, n.LogN(3, 0.3));
        const PhaseId gen = *h.phases.Find("generate");
        b.Phase(gen, n.Chance(0.3) ? n.LogN(5200, 0.1) : n.LogN(1800, 0.1));
        b.Phase(phase::kHost, n.LogN(250, 0.1));
        b.Phase(phase::kCompute, n.Jit(1200, 0.03));
        b.Phase(phase::kOptimizer, n.Jit(50, 0.03));
        return b.Finish();
      }};
  AddHeldOut(m);
  AddRegressions(m);
  return m;
}

}  // namespace

std::vector<std::string> ScenarioNames() {
  std::vector<std::string> out;
  for (const auto& [name, s] : Scenarios()) out.push_back(name);
  return out;
}

absl::Status WriteScenario(const std::string& name, const std::string& path, int steps,
                           uint64_t seed) {
  const auto all = Scenarios();
  auto it = all.find(name);
  if (it == all.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown scenario '", name, "' (known: ", absl::StrJoin(ScenarioNames(), ", "), ")"));
  }
  const Scenario& sc = it->second;
  StepLogHeader h;
  h.source = absl::StrCat("omni_tracegen ", name);
  if (sc.header) sc.header(h);
  auto w = StepLogWriter::Open(path, h);
  if (!w.ok()) return w.status();
  Noise noise(seed);
  int64_t t = 1000 * kMs;
  for (int64_t s = 0; s < steps; ++s) {
    if (name == "restart" && s == 120) t += 5000 * kMs;  // the process restarts
    const StepRecord rec = sc.step(noise, s, t, h);
    if (s % sc.log_every == sc.log_every - 1) {
      if (auto st = (*w)->Append(rec, h.phases, false); !st.ok()) return st;
    }
    t = rec.end_ns + Ms(sc.gap_ms);
  }
  return (*w)->Close();
}

}  // namespace omni::tracegen
