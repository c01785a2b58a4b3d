#include "tracegen_scenarios.h"

#include <cmath>
#include <functional>
#include <map>
#include <random>

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
