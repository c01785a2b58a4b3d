// bench_guest_yield: how long a guest takes to give the devices back when the
// host leaves its idle phase early.
//  - cooperative: a guest thread runs 2 ms units gated by GuestGate on the
//    real clock; a host thread opens windows stated to last 50 ms and closes
//    each early, after 5 to 40 ms (GuestGate::HostClosed); the latency is
//    from the close to the end of the guest's unit in flight. On a CPU the
//    host thread's own wakeup may wait for the guest's core: how late the
//    host's timed wakeups ran is reported too, with the guest in the normal
//    class and in SCHED_IDLE;
//  - pause: SIGSTOP of a spinning guest process until the kernel reports it
//    stopped (ProcessPauser).
// Prints one JSON line.
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <new>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "omni/clock.h"
#include "omni/colocate_gate.h"
#include "omni/colocate_pause.h"

namespace {

using omni::colocate::GuestGate;
using omni::colocate::OpenWindow;

constexpr int64_t kMs = 1'000'000;
constexpr int kWindows = 200;

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

struct Coop {
  omni::colocate::GateStats stats;
  int64_t units = 0;
  std::vector<double> host_late_ms;  // how late the host's timed wakeups ran
};

// Windows stated to last 50 ms, closed early after 5 to 40 ms; the guest in
// the normal class or in SCHED_IDLE.
Coop Cooperative(bool guest_sched_idle) {
  const omni::Clock* clock = omni::Clock::Real();
  Coop out;
  auto gate_or = GuestGate::Create({}, clock);
  if (!gate_or.ok()) return out;
  GuestGate& gate = **gate_or;
  const int64_t unit_ns = 2 * kMs;

  absl::Mutex mu;
  OpenWindow window;  // guarded by mu
  std::atomic<bool> stop{false};
  std::atomic<int64_t> units{0};
  std::thread guest([&] {
    if (guest_sched_idle) {
      sched_param sp{};
      pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
    }
    while (!stop.load()) {
      OpenWindow w;
      {
        absl::MutexLock l(&mu);
        w = window;
      }
      if (!gate.BeforeUnit(w, unit_ns).start()) {
        absl::SleepFor(absl::Microseconds(100));  // waits for a window
        continue;
      }
      const int64_t end = clock->NowNanos() + unit_ns;
      while (clock->NowNanos() < end) {
      }  // the unit: 2 ms of work
      gate.UnitDone(clock->NowNanos());
      units.fetch_add(1);
    }
  });
  std::mt19937_64 rng(1);
  for (int i = 0; i < kWindows; ++i) {
    {
      absl::MutexLock l(&mu);
      window.open = true;
      window.window_id = static_cast<uint64_t>(i);
      window.opened_at_ns = clock->NowNanos();
      window.remaining_ns = 50 * kMs;
      window.as_of_ns = window.opened_at_ns;
      window.confidence = 0.95;
    }
    const int64_t sleep_ns = (5 + static_cast<int64_t>(rng() % 36)) * kMs;
    const int64_t target = clock->NowNanos() + sleep_ns;
    absl::SleepFor(absl::Nanoseconds(sleep_ns));
    const int64_t closed = clock->NowNanos();
    out.host_late_ms.push_back(static_cast<double>(closed - target) / 1e6);
    gate.HostClosed(static_cast<uint64_t>(i), closed);  // early
    {
      absl::MutexLock l(&mu);
      window.open = false;
    }
    absl::SleepFor(absl::Milliseconds(5));  // the host's busy phase
  }
  stop.store(true);
  guest.join();
  out.stats = gate.Stats();
  out.units = units.load();
  return out;
}

int Run() {
  const Coop normal = Cooperative(false);
  const Coop idle = Cooperative(true);

  // Pauses of a spinning process.
  void* m = mmap(nullptr, sizeof(std::atomic<int64_t>), PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return 1;
  auto* counter = new (m) std::atomic<int64_t>(0);
  const pid_t pid = fork();
  if (pid == 0) {
    for (;;) counter->fetch_add(1, std::memory_order_relaxed);
  }
  std::vector<double> pause_us;
  {
    omni::colocate::ProcessPauser pauser(pid);
    absl::SleepFor(absl::Milliseconds(20));
    for (int i = 0; i < 50; ++i) {
      auto p = pauser.Pause();
      if (!p.ok()) break;
      pause_us.push_back(absl::ToDoubleMicroseconds(*p));
      if (!pauser.Resume().ok()) break;
      absl::SleepFor(absl::Milliseconds(2));
    }
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  munmap(m, sizeof(std::atomic<int64_t>));

  for (const auto& [name, c] :
       {std::pair<const char*, const Coop&>{"normal", normal}, {"sched_idle", idle}}) {
    std::printf(
        "cooperative, guest %-10s: %lld units in %d windows, %lld yields, p50 %.3f ms, p99 %.3f "
        "ms (unit 2 ms); host wakeups late p50 %.3f ms, p99 %.3f ms\n",
        name, static_cast<long long>(c.units), kWindows, static_cast<long long>(c.stats.yields),
        static_cast<double>(c.stats.yield_p50_ns) / 1e6,
        static_cast<double>(c.stats.yield_p99_ns) / 1e6, Quantile(c.host_late_ms, 0.5),
        Quantile(c.host_late_ms, 0.99));
  }
  std::printf("pause (SIGSTOP): %zu pauses, p50 %.0f us, p99 %.0f us\n", pause_us.size(),
              Quantile(pause_us, 0.5), Quantile(pause_us, 0.99));
  std::printf(
      "{\"benchmark\": \"guest_yield\", \"unit_ms\": 2, \"windows\": %d, "
      "\"coop_yield_p50_ms\": %.3f, \"coop_yield_p99_ms\": %.3f, \"host_late_p99_ms\": %.3f, "
      "\"sched_idle_coop_yield_p99_ms\": %.3f, \"sched_idle_host_late_p99_ms\": %.3f, "
      "\"pause_p50_us\": %.0f, \"pause_p99_us\": %.0f}\n",
      kWindows, static_cast<double>(normal.stats.yield_p50_ns) / 1e6,
      static_cast<double>(normal.stats.yield_p99_ns) / 1e6, Quantile(normal.host_late_ms, 0.99),
      static_cast<double>(idle.stats.yield_p99_ns) / 1e6, Quantile(idle.host_late_ms, 0.99),
      Quantile(pause_us, 0.5), Quantile(pause_us, 0.99));
  return pause_us.size() == 50 ? 0 : 1;
}

}  // namespace

int main() { return Run(); }
