// Cost of the step hooks, side by side with the clock reads they need.
//
// One step with two phases through the hooks (BeginStep, BeginPhase,
// EndPhase, BeginPhase, EndPhase, EndStep) reads the clock 6 times. The
// baseline is those 6 reads through the same Clock; the figure is
//   hook_overhead_ratio = time(step through hooks) / time(6 clock reads)
// measured in alternating rounds in one run, median over rounds (goal <= 2).
// Rounds are timed in the training thread's CPU time, so that time spent
// descheduled on a busy host (or while the worker thread runs on the same
// core) is not counted as a cost of the hooks; wall_ratio is the same figure
// in wall-clock time. Every step enters an idle phase (data_wait) and leaves
// it, so each step also writes two window notices (notices_per_step).
// allocations_per_step counts operator new calls on the training thread
// during the hook loop (goal 0); the worker thread runs as in production.
// A round (2,000 steps) fits the ring (65,536 records) and the worker drains
// it between rounds, so no timed step is dropped (steps_dropped, goal 0; the
// hooks run at millions of steps per second here, a real step is
// milliseconds long).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <new>
#include <vector>

#include "omni/telemetry.h"

namespace {
thread_local int64_t t_allocations = 0;
}  // namespace

void* operator new(std::size_t n) {
  ++t_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;  // NOLINT(cppcoreguidelines-no-malloc)
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }  // NOLINT(cppcoreguidelines-no-malloc)
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);  // NOLINT(cppcoreguidelines-no-malloc)
}

namespace {

int64_t NowNs() { return omni::Clock::Real()->NowNanos(); }

int64_t ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 31;
  const int iters = 2000;
  omni::TelemetryOptions opt;
  opt.ring_capacity = 1 << 16;
  auto tel_or = omni::Telemetry::Create(opt);
  if (!tel_or.ok()) {
    std::fprintf(stderr, "%s\n", std::string(tel_or.status().message()).c_str());
    return 1;
  }
  omni::Telemetry& tel = **tel_or;
  const omni::Clock* clock = omni::Clock::Real();

  std::vector<double> clock_ns, hook_ns, ratios, wall_ratios;
  int64_t sink = 0;
  int64_t allocs = 0, steps = 0;
  int64_t step = 0;
  for (int r = 0; r < rounds; ++r) {
    // Baseline: the 6 clock reads one step needs.
    int64_t t0 = ThreadCpuNs();
    int64_t w0 = NowNs();
    for (int i = 0; i < iters; ++i) {
      sink += clock->NowNanos();
      sink += clock->NowNanos();
      sink += clock->NowNanos();
      sink += clock->NowNanos();
      sink += clock->NowNanos();
      sink += clock->NowNanos();
    }
    const double base = static_cast<double>(ThreadCpuNs() - t0) / iters;
    const double wall_base = static_cast<double>(NowNs() - w0) / iters;
    // The hooks.
    const int64_t a0 = t_allocations;
    t0 = ThreadCpuNs();
    w0 = NowNs();
    for (int i = 0; i < iters; ++i) {
      tel.BeginStep(step++).IgnoreError();
      tel.BeginPhase(omni::phase::kDataWait).IgnoreError();
      tel.EndPhase(omni::phase::kDataWait).IgnoreError();
      tel.BeginPhase(omni::phase::kCompute).IgnoreError();
      tel.EndPhase(omni::phase::kCompute).IgnoreError();
      tel.EndStep().IgnoreError();
    }
    const double hooks = static_cast<double>(ThreadCpuNs() - t0) / iters;
    const double wall = static_cast<double>(NowNs() - w0) / iters;
    allocs += t_allocations - a0;  // before the vectors below grow
    wall_ratios.push_back(wall / wall_base);
    steps += iters;
    clock_ns.push_back(base);
    hook_ns.push_back(hooks);
    ratios.push_back(hooks / base);
    // Paced: the worker drains the ring (outside the timed loops) before the
    // next round, so every timed step takes the recording path (a step the
    // ring has no room for skips the ring write and would flatter the hooks).
    if (auto st = tel.Flush(); !st.ok()) {
      std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
      return 1;
    }
  }
  if (auto st = tel.Flush(); !st.ok()) return 1;
  const omni::TelemetryCounters c = tel.Counters();
  const double notices = static_cast<double>(tel.LatestWindow().sequence);
  if (auto st = tel.Close(); !st.ok()) return 1;
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("clock reads per step: 6; rounds: %d x %d steps\n", rounds, iters);
  std::printf("6 clock reads: %.1f ns; step with two phases through hooks: %.1f ns\n",
              median(clock_ns), median(hook_ns));
  std::printf("steps recorded %lld, dropped (worker behind) %lld, misuse %lld (sink %lld)\n",
              static_cast<long long>(c.steps_recorded), static_cast<long long>(c.steps_dropped),
              static_cast<long long>(c.misuse_errors), static_cast<long long>(sink & 1));
  std::printf(
      "{\"benchmark\":\"hook_overhead\",\"hook_overhead_ratio\":%.3f,\"step_hooks_ns\":%.1f,"
      "\"clock_reads_ns\":%.1f,\"allocations_per_step\":%.4f,\"steps\":%lld,\"steps_dropped\":%lld,"
      "\"notices_per_step\":%.2f,\"wall_ratio\":%.3f}\n",
      median(ratios), median(hook_ns), median(clock_ns),
      static_cast<double>(allocs) / static_cast<double>(steps), static_cast<long long>(steps),
      static_cast<long long>(c.steps_dropped), notices / static_cast<double>(steps),
      median(wall_ratios));
  return c.misuse_errors == 0 ? 0 : 1;
}
