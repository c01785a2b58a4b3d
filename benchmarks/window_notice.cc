// Latency of a window notice from the hook that writes it to a reader in
// another process polling the shared-memory channel, and the cost of a poll
// (read_ns: no window open; read_open_ns: a window open and matched to the
// last of 64 forecast claims).
//
// A reader process is forked first; it opens the channel and polls it
// (WindowChannelReader::Read, then a sleep of `poll_us`). The training side
// runs steps of a data wait (idle: a window opens) and compute (busy: it
// closes) through Telemetry with window_channel_name set. For every notice the
// reader sees, latency = reader's CLOCK_MONOTONIC at the read − the time the
// hook stamped on the notice (opened_ns or closed_ns): the hook's write, the
// wait for the next poll, and the read. A notice the reader never saw (the
// next one replaced it first) counts as infinitely late in the percentiles;
// within_1ms is the fraction of notices seen within 1 ms.
//
//   bench_window_notice [steps=400] [poll_us=100]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "omni/telemetry.h"
#include "omni/window_channel.h"

namespace {

int64_t ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

constexpr int64_t kMissed = std::numeric_limits<int64_t>::max();

// The reader process: writes one int64 latency per notice (kMissed for a
// notice it did not see) to `out`, then exits.
[[noreturn]] void ReaderMain(const std::string& name, int poll_us, int out) {
  std::unique_ptr<omni::WindowChannelReader> r;
  for (int i = 0; i < 10'000 && r == nullptr; ++i) {
    auto o = omni::WindowChannelReader::Open(name);
    if (o.ok()) {
      r = *std::move(o);
    } else {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  if (r == nullptr) ::_exit(2);
  const omni::Clock* clock = omni::Clock::Real();
  std::vector<int64_t> lat;
  lat.reserve(1 << 16);
  uint64_t last = 0;
  bool closed_seen = false;  // read once more after it, then stop
  const int64_t give_up = clock->NowNanos() + 120'000'000'000;
  while (clock->NowNanos() < give_up) {
    auto n = r->Read();
    if (!n.ok()) ::_exit(3);
    if (n->sequence != last) {
      const int64_t now = clock->NowNanos();
      for (uint64_t s = last + 1; s < n->sequence; ++s) lat.push_back(kMissed);
      const int64_t stamped = n->state == omni::WindowState::kOpen ? n->opened_ns : n->closed_ns;
      lat.push_back(now - stamped);
      last = n->sequence;
    }
    if (n->writer_closed) {
      if (closed_seen) break;
      closed_seen = true;
      continue;
    }
    if (poll_us > 0) absl::SleepFor(absl::Microseconds(poll_us));
  }
  const auto* p = reinterpret_cast<const char*>(lat.data());
  size_t left = lat.size() * sizeof(int64_t);
  while (left > 0) {
    const ssize_t w = ::write(out, p, left);
    if (w <= 0) ::_exit(4);
    p += w;
    left -= static_cast<size_t>(w);
  }
  ::_exit(0);
}

// Microseconds, or "null" (JSON) for a notice that was never seen.
std::string Us(int64_t ns) {
  if (ns == kMissed) return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", static_cast<double>(ns) / 1e3);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 400, poll_us = 100;
  if (argc > 3 || (argc > 1 && (!absl::SimpleAtoi(argv[1], &steps) || steps <= 0)) ||
      (argc > 2 && (!absl::SimpleAtoi(argv[2], &poll_us) || poll_us <= 0))) {
    std::fprintf(stderr,
                 "usage: bench_window_notice [STEPS (default 400) [POLL_US (default 100)]]\n"
                 "  one JSON line: the window notices' latency from the hook to a reader\n"
                 "  process polling the channel every POLL_US microseconds\n");
    return 2;
  }
  const std::string name = "omni-bench-" + std::to_string(::getpid());
  int fds[2];
  if (::pipe(fds) != 0) return 1;
  const pid_t pid = ::fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    ::close(fds[0]);
    ReaderMain(name, poll_us, fds[1]);
  }
  ::close(fds[1]);

  omni::TelemetryOptions opt;
  opt.window_channel_name = name;
  auto tel_or = omni::Telemetry::Create(opt);
  if (!tel_or.ok()) {
    std::fprintf(stderr, "%s\n", std::string(tel_or.status().message()).c_str());
    return 1;
  }
  omni::Telemetry& tel = **tel_or;
  absl::SleepFor(absl::Milliseconds(50));  // let the reader open the channel
  for (int i = 0; i < steps; ++i) {
    omni::StepScope step(tel);
    {
      omni::PhaseScope p(tel, omni::phase::kDataWait);
      absl::SleepFor(absl::Microseconds(1500));
    }
    omni::PhaseScope c(tel, omni::phase::kCompute);
    absl::SleepFor(absl::Microseconds(1000));
  }
  const uint64_t written = tel.LatestWindow().sequence;

  // The cost of one poll, measured here on a reader of the same channel in
  // this thread's CPU time (time spent descheduled on a busy host is not a
  // cost of the poll).
  auto reader = omni::WindowChannelReader::Open(name);
  if (!reader.ok()) return 1;
  const int polls = 200'000;
  const int64_t t0 = ThreadCpuNs();
  int64_t sink = 0;
  for (int i = 0; i < polls; ++i) sink += static_cast<int64_t>((*reader)->Read()->sequence);
  const double read_ns = static_cast<double>(ThreadCpuNs() - t0) / static_cast<double>(polls);

  if (auto st = tel.Close(); !st.ok()) return 1;
  // A poll of an open window, its notice matched to the last of a full
  // outlook's forecast claims (the reader scans them all): what a guest
  // pays at each poll while a window is open.
  double read_open_ns = 0;
  {
    auto w = omni::WindowChannelWriter::Create(name + "-open");
    if (!w.ok()) return 1;
    omni::WindowOutlook o;
    o.state = omni::OutlookState::kForecast;
    for (int i = 0; i < omni::kMaxForecastClaims; ++i) {
      o.claims[static_cast<size_t>(i)] = omni::ForecastClaim{
          i, 1'000'000'000, omni::phase::kDataWait, omni::IdleKind::kDataStall, 0};
    }
    o.num_claims = omni::kMaxForecastClaims;
    (*w)->PublishOutlook(o);
    (*w)->OpenWindow(omni::phase::kDataWait, omni::IdleKind::kDataStall,
                     omni::kMaxForecastClaims - 1, omni::Clock::Real()->NowNanos());
    auto open_reader = omni::WindowChannelReader::Open(name + "-open");
    if (!open_reader.ok()) return 1;
    const int64_t t1 = ThreadCpuNs();
    for (int i = 0; i < polls; ++i) sink += (*open_reader)->Read()->forecast_guaranteed_ns;
    read_open_ns = static_cast<double>(ThreadCpuNs() - t1) / static_cast<double>(polls);
  }
  std::vector<int64_t> lat;
  int64_t buf[512];
  for (;;) {
    const ssize_t r = ::read(fds[0], buf, sizeof(buf));
    if (r <= 0) break;
    lat.insert(lat.end(), buf, buf + r / static_cast<ssize_t>(sizeof(int64_t)));
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || lat.empty()) {
    std::fprintf(stderr, "reader process failed (status %d)\n", status);
    return 1;
  }
  const auto missed = std::count(lat.begin(), lat.end(), kMissed);
  const auto within_1ms =
      std::count_if(lat.begin(), lat.end(), [](int64_t ns) { return ns <= 1'000'000; });
  std::sort(lat.begin(), lat.end());
  const auto pct = [&](double p) {
    return lat[std::min(lat.size() - 1, static_cast<size_t>(p * static_cast<double>(lat.size())))];
  };
  std::printf("notices written %" PRIu64 ", seen %zu (missed %td), reader polls every %d us\n",
              written, lat.size() - static_cast<size_t>(missed), missed, poll_us);
  std::printf(
      "latency hook -> reader process: p50 %s us, p99 %s us, max %s us; "
      "one poll %.1f ns (sink %" PRId64 ")\n",
      Us(pct(0.5)).c_str(), Us(pct(0.99)).c_str(), Us(lat.back()).c_str(), read_ns, sink & 1);
  std::printf(
      "{\"benchmark\":\"window_notice\",\"latency_p50_us\":%s,\"latency_p99_us\":%s,"
      "\"latency_max_us\":%s,\"notices\":%" PRIu64
      ",\"missed\":%td,\"poll_us\":%d,"
      "\"read_ns\":%.1f,\"read_open_ns\":%.1f,\"within_1ms\":%.4f,\"goal_p99_us\":1000}\n",
      Us(pct(0.5)).c_str(), Us(pct(0.99)).c_str(), Us(lat.back()).c_str(), written, missed, poll_us,
      read_ns, read_open_ns, static_cast<double>(within_1ms) / static_cast<double>(lat.size()));
  return 0;
}
