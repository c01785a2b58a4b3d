// omni_tracegen: writes a synthetic step log (JSON Lines, omni.steplog v1) for
// forecaster tests, benchmarks and demos. Deterministic for a given seed on a
// given standard library.
//
//   omni_tracegen --out tests/data/pipeline_ckpt.jsonl --steps 1200 --seed 3
//   omni_tracegen --scenario stall_every3 --out tests/data/stall_every3.jsonl --steps 240 --seed 21
//
// Scenarios other than the default "pipeline" are in tracegen_scenarios.cc
// (steady, heavy_stalls, stall_every3, periodic_declared, periodic_undeclared,
// restart, sampled10, rlhf_bimodal, and the held-out drift, contention,
// bursty_stalls, time_ckpt, straggler, sampled5, gc_pauses, and the regressions
// rhythm_change, events_on_rhythm;
// tests/data/README.md describes each).
//
// The stage runs a GPipe schedule (see omni/forecast.h, PipelineSchedule):
// forward passes of `micro_batches` micro-batches, then their backward passes,
// with per-micro-batch jitter; the bubbles are logged as pipeline_bubble
// phases nested in compute, so the log holds the real idle time.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>

#include "omni/step_log.h"
#include "tracegen_scenarios.h"

namespace {

struct Args {
  std::string out;
  std::string scenario = "pipeline";
  int steps = 1200;
  uint64_t seed = 3;
  int stages = 4;
  int micro_batches = 8;
  int stage = 1;
  int ckpt_every = 100;
  double tf_ms = 4.0;  // forward time of one micro-batch
  double ckpt_ms = 350.0;
};

constexpr const char* kUsage =
    "usage: omni_tracegen --out PATH [--scenario NAME] [--steps N] [--seed S] [--stages P]\n"
    "                     [--micro-batches M] [--stage R] [--ckpt-every N]\n"
    "  (--stages, --micro-batches, --stage and --ckpt-every shape the default 'pipeline')\n";

int Usage(const char* msg) {
  std::fprintf(stderr, "omni_tracegen: %s\n%s", msg, kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string_view k = argv[i];
    if (k == "--help") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (i + 1 >= argc) return Usage(("missing value for " + std::string(k)).c_str());
    const char* v = argv[++i];
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    const bool num = end != v && *end == '\0';
    if (k == "--out") {
      a.out = v;
    } else if (k == "--scenario") {
      a.scenario = v;
    } else if (!num) {
      return Usage(("not an integer for " + std::string(k) + ": " + v).c_str());
    } else if (k == "--steps") {
      a.steps = static_cast<int>(n);
    } else if (k == "--seed") {
      a.seed = static_cast<uint64_t>(n);
    } else if (k == "--stages") {
      a.stages = static_cast<int>(n);
    } else if (k == "--micro-batches") {
      a.micro_batches = static_cast<int>(n);
    } else if (k == "--stage") {
      a.stage = static_cast<int>(n);
    } else if (k == "--ckpt-every") {
      a.ckpt_every = static_cast<int>(n);
    } else {
      return Usage(("unknown flag " + std::string(k)).c_str());
    }
  }
  if (a.out.empty()) return Usage("--out is required");
  if (a.steps <= 0 || a.stages < 1 || a.micro_batches < 1 || a.stage < 0 || a.stage >= a.stages ||
      a.ckpt_every < 0) {
    return Usage(
        "bad numbers: need steps > 0, stages >= 1, micro-batches >= 1, 0 <= stage < stages");
  }

  if (a.scenario != "pipeline") {
    if (auto st = omni::tracegen::WriteScenario(a.scenario, a.out, a.steps, a.seed); !st.ok()) {
      std::fprintf(stderr, "omni_tracegen: %s\n", std::string(st.message()).c_str());
      return absl::IsInvalidArgument(st) ? 2 : 1;
    }
    std::printf("wrote scenario %s (%d steps) to %s\n", a.scenario.c_str(), a.steps, a.out.c_str());
    return 0;
  }
  omni::StepLogHeader h;
  h.source = "omni_tracegen pipeline";
  h.pipeline = omni::PipelineSchedule{a.stages, a.micro_batches, a.stage, 2.0};
  if (a.ckpt_every > 0) {
    h.checkpoint =
        omni::PeriodicEvent{a.ckpt_every, a.ckpt_every - 1, static_cast<int64_t>(a.ckpt_ms * 1e6)};
  }
  auto w = omni::StepLogWriter::Open(a.out, h);
  if (!w.ok()) {
    std::fprintf(stderr, "omni_tracegen: %s\n", std::string(w.status().message()).c_str());
    return 1;
  }
  std::mt19937_64 rng(a.seed);
  std::normal_distribution<double> jitter(1.0, 0.03);
  std::lognormal_distribution<double> data_ms(std::log(1.5), 0.35);
  const auto ms = [](double x) { return static_cast<int64_t>(std::llround(x * 1e6)); };

  int64_t t = ms(1000);
  const int p = a.stages, m = a.micro_batches, r = a.stage;
  for (int s = 0; s < a.steps; ++s) {
    omni::StepRecord rec;
    rec.step = s;
    rec.start_ns = t;
    // The first steps are slower (allocator, autotuning), as in real jobs.
    const double warm = s < 8 ? 1.0 + 0.5 * (8 - s) : 1.0;
    auto span = [&](omni::PhaseId ph, int64_t a0, int64_t a1, int depth) {
      omni::PhaseSpan& sp = rec.spans[rec.num_spans++];
      sp.phase = ph;
      sp.start_ns = a0;
      sp.end_ns = a1;
      sp.depth = static_cast<uint8_t>(depth);
    };
    int64_t c = t;
    const int64_t dw = ms(data_ms(rng));
    span(omni::phase::kDataWait, c, c + dw, 0);
    c += dw + ms(0.05);
    // GPipe stage r: bubble r*tf, m forwards, bubble (p-1-r)(tf+tb), m backwards, bubble r*tb.
    const double tf = a.tf_ms * warm * jitter(rng);
    const double tb = 2.0 * tf;
    double fwd = 0, bwd = 0;
    for (int i = 0; i < m; ++i) fwd += tf * jitter(rng);
    for (int i = 0; i < m; ++i) bwd += tb * jitter(rng);
    const double b1 = r * tf, b2 = (p - 1 - r) * (tf + tb), b3 = r * tb;
    const int64_t cstart = c;
    const int compute_idx = rec.num_spans;
    span(omni::phase::kCompute, c, c, 0);
    if (b1 > 0) span(omni::phase::kPipelineBubble, c, c + ms(b1), 1);
    c += ms(b1) + ms(fwd);
    if (b2 > 0) span(omni::phase::kPipelineBubble, c, c + ms(b2), 1);
    c += ms(b2) + ms(bwd);
    if (b3 > 0) span(omni::phase::kPipelineBubble, c, c + ms(b3), 1);
    c += ms(b3);
    rec.spans[compute_idx].start_ns = cstart;
    rec.spans[compute_idx].end_ns = c;
    const int64_t comm = ms(3.0 * jitter(rng));
    span(omni::phase::kComm, c, c + comm, 0);
    c += comm;
    const int64_t opt = ms(2.0 * jitter(rng));
    span(omni::phase::kOptimizer, c, c + opt, 0);
    c += opt + ms(0.1);
    if (h.checkpoint.OccursAt(s)) {
      const int64_t ck = ms(a.ckpt_ms * jitter(rng));
      span(omni::phase::kCheckpoint, c, c + ck, 0);
      c += ck;
    }
    rec.end_ns = c;
    if (auto st = (*w)->Append(rec, h.phases, false); !st.ok()) {
      std::fprintf(stderr, "omni_tracegen: %s\n", std::string(st.message()).c_str());
      return 1;
    }
    t = c + ms(0.02);
  }
  if (auto st = (*w)->Close(); !st.ok()) {
    std::fprintf(stderr, "omni_tracegen: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::printf("wrote %d steps to %s\n", a.steps, a.out.c_str());
  return 0;
}
