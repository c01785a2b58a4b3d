// colocate_guest: a best-effort LibTorch trainer that runs in a critical
// (host) job's idle windows on the same machine. Copy it and replace the
// model and the `step` lambda.
//
//   colocate_guest --channel job-42 --steps 2000 --ckpt-dir /tmp/guest
//
// It attaches to the host's live window notices (omni_train --window-channel
// job-42), starts a training step only when the open window's remaining
// duration at the stated confidence covers the step's cost bound + a guard
// (omni/colocate_guest.h), and yields at the next step boundary when the host
// is busy again. On SIGTERM or a scheduler's notice (--notice-file) it saves
// through its own omni::Runtime (Runtime::Yield) and exits 75 ("preempted,
// resumable"), or 76 when not even a save fits the notice's deadline; started
// again with the same flags it resumes bit-exactly. With --pause a supervisor
// stops and continues the trainer by window instead (SIGSTOP / SIGCONT).
// With --max-wait-s S it does not wait longer than S for a window of its
// kinds: when the host's forecast (or a busy period the host announced)
// says no such window can open within S, or after waiting S, it saves the
// same way and exits 75 ("the host is busy for at least N s"); started again
// it resumes bit-exactly.
// With --store URL (and --store-prefix P) instead of --channel it reads the
// windows of a host on another machine from the host's store keys
// (omni_train --store URL --publish-prefix P; omni/colocate_store.h).
// Without either it trains ungated (the baselines: plain time sharing, or
// SCHED_IDLE set by its launcher). docs/colocation.md.
// Last line of stdout: final step=N params_xxh3=H loss=L
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "omni/colocate_channel.h"
#include "omni/colocate_guest.h"
#include "omni/colocate_pause.h"
#include "omni/colocate_store.h"
#include "omni/hash.h"
#include "omni/preemption.h"
#include "omni/runtime.h"
#include "omni/state.h"
#include "omni/torch/params.h"
#include "omni/torch/state.h"
#include "omni/torch/store.h"

namespace {

std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal.store(sig); }
// The trainer of --pause: its supervisor stopped waiting for a window
// (--max-wait-s) and tells it with SIGUSR2 to save and leave.
std::atomic<int> g_host_busy{0};
void OnHostBusy(int /*sig*/) { g_host_busy.store(1); }

struct Flags {
  std::string channel, ckpt_dir, notice_file, log, runs_log, kinds = "all";
  // A host on another machine: its store (file://, tcp://) and the prefix it
  // publishes under (omni_train --publish-prefix).
  std::string store, store_prefix = "omni/telemetry";
  int64_t steps = 1000, seed = 1, hidden = 128, batch = 64;
  double guard_ms = 2;
  double unit_ms = 10;        // the step's cost bound until one was measured
  double attach_s = 30;       // wait this long for the host's channel to appear
  double poll_ms = 0.5;       // how often an open window's remainder is refreshed
  double yield_bound_ms = 1;  // --pause: a stop later than this after a close is a miss
  double max_wait_s = -1;     // the longest wait for a window (< 0: for ever)
  bool pause = false;         // supervisor + stopped/continued trainer child
  bool until_close = false;   // --pause: run to the close, not to the claimed remainder
  bool normal_class = false;  // --pause: leave the trainer in the normal class (not SCHED_IDLE)
  bool child = false;         // (internal) the trainer child of --pause
};

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "colocate_guest: %s\n", st.ToString().c_str());
  return 1;
}

bool Parse(int argc, char** argv, Flags& f) {
  const std::map<std::string, std::string*> text = {{"--channel", &f.channel},
                                                    {"--ckpt-dir", &f.ckpt_dir},
                                                    {"--notice-file", &f.notice_file},
                                                    {"--log", &f.log},
                                                    {"--runs-log", &f.runs_log},
                                                    {"--kinds", &f.kinds},
                                                    {"--store", &f.store},
                                                    {"--store-prefix", &f.store_prefix}};
  const std::map<std::string, int64_t*> ints = {
      {"--steps", &f.steps}, {"--seed", &f.seed}, {"--hidden", &f.hidden}, {"--batch", &f.batch}};
  const std::map<std::string, double*> reals = {{"--guard-ms", &f.guard_ms},
                                                {"--unit-ms", &f.unit_ms},
                                                {"--attach-s", &f.attach_s},
                                                {"--poll-ms", &f.poll_ms},
                                                {"--yield-bound-ms", &f.yield_bound_ms},
                                                {"--max-wait-s", &f.max_wait_s}};
  int i = 1;
  const std::map<std::string, bool*> switches = {{"--pause", &f.pause},
                                                 {"--until-close", &f.until_close},
                                                 {"--normal-class", &f.normal_class}};
  for (; i < argc && switches.count(argv[i]) != 0; ++i) *switches.at(argv[i]) = true;
  for (; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (auto t = text.find(k); t != text.end()) {
      *t->second = v;
    } else if (auto n = ints.find(k); n != ints.end()) {
      if (!absl::SimpleAtoi(v, n->second)) return false;
    } else if (auto r = reals.find(k); r != reals.end()) {
      if (!absl::SimpleAtod(v, r->second)) return false;
    } else {
      return false;
    }
  }
  return i == argc && !f.ckpt_dir.empty() && f.steps > 0 && f.poll_ms > 0 &&
         (!f.pause || !f.channel.empty()) && (f.channel.empty() || f.store.empty());
}

// `watcher`: a thread reads the notices (else the thread that waits for a
// change does: the supervisor, woken once per notice).
absl::StatusOr<std::unique_ptr<omni::colocate::ChannelWindowSource>> Attach(
    const Flags& flags, omni::colocate::GuestGate* gate, bool watcher = true) {
  absl::StatusOr<uint32_t> kinds = omni::colocate::ParseKinds(flags.kinds);
  if (!kinds.ok()) return kinds.status();
  omni::colocate::ChannelSourceOptions so;
  so.poll = absl::Nanoseconds(static_cast<int64_t>(1e6 * flags.poll_ms));
  so.kinds = *kinds;
  so.watcher = watcher;
  // Without a watcher (the supervisor) nothing but a notice needs it between
  // windows: each timed wake-up is CPU on the host's core.
  if (!watcher) so.closed_poll = absl::Milliseconds(100);
  bool said = false;
  for (auto until = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(static_cast<int64_t>(1e3 * flags.attach_s));
       ;) {
    auto opened = omni::colocate::ChannelWindowSource::Open(flags.channel, gate, so);
    // A signal to the supervisor (--pause) ends the wait: it was told to
    // yield before it found the host.
    if (opened.ok() || !absl::IsNotFound(opened.status()) ||
        std::chrono::steady_clock::now() > until || g_signal.load() != 0) {
      return opened;
    }
    if (!std::exchange(said, true)) {  // once: ready, and waiting for its host
      std::fprintf(stderr, "colocate_guest: waiting up to %.0f s for the host's channel %s\n",
                   flags.attach_s, flags.channel.c_str());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// --store: a host on another machine, read from its store keys; `store`
// receives the opened store, which must outlive the source.
absl::StatusOr<std::unique_ptr<omni::colocate::StoreWindowSource>> AttachStore(
    const Flags& flags, omni::colocate::GuestGate* gate, std::unique_ptr<omni::Store>& store) {
  if (auto st = omni::torch_ext::RegisterTcpStore(); !st.ok()) return st;
  absl::StatusOr<std::unique_ptr<omni::Store>> opened = omni::OpenStore(flags.store);
  if (!opened.ok()) return opened.status();
  store = *std::move(opened);
  absl::StatusOr<uint32_t> kinds = omni::colocate::ParseKinds(flags.kinds);
  if (!kinds.ok()) return kinds.status();
  omni::colocate::StoreSourceOptions so;
  so.prefix = flags.store_prefix;
  so.kinds = *kinds;
  return omni::colocate::StoreWindowSource::Open(*store, gate, so);
}

absl::Duration MaxWait(const Flags& flags) {
  return flags.max_wait_s < 0 ? absl::InfiniteDuration()
                              : absl::Nanoseconds(static_cast<int64_t>(1e9 * flags.max_wait_s));
}

// Why a guest stopped waiting (GuestStop::kHostBusy / kWaitedTooLong), for
// its log and its Runtime's yield: how long the host is busy at least, and
// who says so (its forecast or its announcement).
// `stats` and `unit_bound_ns` (the unit's cost bound): where windows opened
// too short for a unit, it says how many and the longest claim against the
// bound (one slow unit is probed away after a few such windows, a cost
// really above every claim stays: UnitCostBound).
std::string BusyReason(omni::colocate::GuestStop why, int64_t no_window_before_ns,
                       int64_t waited_ns, const absl::StatusOr<omni::WindowOutlook>& o,
                       const omni::colocate::GateStats& stats, int64_t unit_bound_ns,
                       const Flags& flags) {
  if (why != omni::colocate::GuestStop::kHostBusy) {
    std::string reason =
        absl::StrFormat("no window of its kinds (%s) for %.1f s (--max-wait-s %g)", flags.kinds,
                        static_cast<double>(waited_ns) / 1e9, flags.max_wait_s);
    if (stats.too_short_windows > 0) {
      absl::StrAppendFormat(&reason,
                            "; %d windows in all were too short for a unit, the longest claimed "
                            "%.1f ms against its cost bound %.1f ms + guard %g ms",
                            stats.too_short_windows,
                            static_cast<double>(stats.too_short_longest_ns) / 1e6,
                            static_cast<double>(unit_bound_ns) / 1e6, flags.guard_ms);
    }
    return reason;
  }
  const double busy_s =
      static_cast<double>(no_window_before_ns - omni::Clock::Real()->NowNanos()) / 1e9;
  const char* who = o.ok() && o->busy_until_ns == no_window_before_ns
                        ? "it announced a busy period"
                        : "its forecast lists no window of the kinds before then";
  return absl::StrFormat("the host is busy for at least %.1f s (%s; kinds %s, --max-wait-s %g)",
                         busy_s, who, flags.kinds, flags.max_wait_s);
}

// The unit loop's figures (a supervisor's: its resumes as units; no
// probes, its slices are fixed).
void PrintGateLine(int64_t units, const omni::colocate::GateStats& s, int64_t probes = 0,
                   int64_t forgiven = 0) {
  std::fprintf(stderr,
               "colocate_guest: units=%" PRId64 " waits=%" PRId64 " yields=%" PRId64
               " yield_p99_ms=%.3f yield_max_ms=%.3f deadline_misses=%" PRId64 " overruns=%" PRId64
               " unit_probes=%" PRId64 " unit_forgiven=%" PRId64 "\n",
               units, s.waits, s.yields, s.yield_p99_ns / 1e6, s.yield_max_ns / 1e6,
               s.deadline_misses, s.overruns, probes, forgiven);
}

int Run(const Flags& flags) {
  // The Runtime first: its preemption monitor makes a SIGTERM during
  // start-up a preemption too. It saves and restores the whole state by key.
  omni::RuntimeOptions ro;
  ro.source = "colocate_guest";
  ro.job_id = "colocate_guest";
  ro.ckpt_dir = flags.ckpt_dir;
  ro.preemption.notice_file = flags.notice_file;
  // A guest needs no forecasts of its own steps (it leaves at its next
  // boundary on any notice, below), and its telemetry worker need not wake
  // every 2 ms: each thread of a paused guest must run once to stop.
  ro.telemetry.forecast_enabled = false;
  ro.telemetry.worker_poll = absl::Milliseconds(100);
  auto rt = omni::Runtime::Create(ro);
  if (!rt.ok()) return Fail(rt.status());
  torch::set_num_threads(1);
  torch::manual_seed(static_cast<uint64_t>(flags.seed));

  // ---- the model, its optimizer and the whole state, by key
  torch::nn::Sequential model(torch::nn::Linear(32, flags.hidden), torch::nn::Tanh(),
                              torch::nn::Linear(flags.hidden, flags.hidden), torch::nn::Tanh(),
                              torch::nn::Linear(flags.hidden, 1));
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
  const torch::Tensor teacher = torch::randn({32, 1});
  float last_loss = 0;
  omni::torch_ext::ModuleState model_state(*model);
  omni::torch_ext::OptimizerState optim_state(optimizer);
  omni::torch_ext::RngState rng_state;  // the data come from the global generator
  omni::BytesState loss_state("loss", &last_loss, sizeof(last_loss));
  for (auto [k, s] : {std::pair<const char*, omni::Stateful*>{"model", &model_state},
                      {"optim", &optim_state},
                      {"rng", &rng_state},
                      {"loss", &loss_state}}) {
    if (auto st = (*rt)->Register(k, s); !st.ok()) return Fail(st);
  }
  absl::StatusOr<int64_t> first = (*rt)->Start();  // restores the newest checkpoint
  if (!first.ok()) return Fail(first.status());
  if (*first > 0) std::fprintf(stderr, "colocate_guest: resumed at step %" PRId64 "\n", *first);

  // ---- one unit of work: a training step on a fresh synthetic batch, one
  // Runtime step (its boundary may answer "save and exit": a notice whose
  // deadline leaves no room for another step)
  std::FILE* log = flags.log.empty() ? nullptr : std::fopen(flags.log.c_str(), "a");
  std::atomic<bool> stop{false}, done{false};
  std::optional<omni::Decision> stopped;  // a kSaveAndExit answered by EndStep
  const auto step = [&]() -> absl::Status {
    const int64_t t0 = omni::Clock::Real()->NowNanos();
    if (auto st = (*rt)->BeginStep(); !st.ok()) return st;
    const torch::Tensor x = torch::randn({flags.batch, 32});
    const torch::Tensor y = torch::tanh(x.matmul(teacher));
    optimizer.zero_grad();
    torch::Tensor loss = torch::mse_loss(model->forward(x), y);
    loss.backward();
    optimizer.step();
    last_loss = loss.item<float>();
    const int64_t s = (*rt)->step();
    absl::StatusOr<omni::Decision> d = (*rt)->EndStep();
    if (!d.ok()) return d.status();
    if (log != nullptr) {
      std::fprintf(log, "{\"step\":%" PRId64 ",\"start_ns\":%" PRId64 ",\"end_ns\":%" PRId64 "}\n",
                   s, t0, omni::Clock::Real()->NowNanos());
    }
    if (d->kind == omni::Decision::kSaveAndExit) {
      stopped = *d;
      stop.store(true);
    }
    return absl::OkStatus();
  };

  // ---- gate the units on the host's windows (or not, without --channel)
  omni::colocate::GateOptions go;
  go.guard = absl::Microseconds(static_cast<int64_t>(1e3 * flags.guard_ms));
  auto gate = omni::colocate::GuestGate::Create(go);
  if (!gate.ok()) return Fail(gate.status());
  // The host's windows: its shared-memory channel on this machine, or its
  // store keys from another one.
  std::unique_ptr<omni::colocate::ChannelWindowSource> channel;
  std::unique_ptr<omni::Store> store;
  std::unique_ptr<omni::colocate::StoreWindowSource> from_store;
  omni::colocate::WindowSource* source = nullptr;
  if (!flags.channel.empty() && !flags.child) {
    auto attached = Attach(flags, gate->get());
    if (!attached.ok()) return Fail(attached.status());
    channel = *std::move(attached);
    source = channel.get();
  } else if (!flags.store.empty()) {
    auto attached = AttachStore(flags, gate->get(), store);
    if (!attached.ok()) return Fail(attached.status());
    from_store = *std::move(attached);
    source = from_store.get();
  }
  const auto host_gone = [&] {
    return channel ? channel->Stats().writer_closed : from_store->Stats().writer_closed;
  };
  const auto outlook = [&]() -> absl::StatusOr<omni::WindowOutlook> {
    return channel ? channel->Outlook() : from_store->Outlook();
  };
  // The trainer child of --pause: ready, it stops itself until the
  // supervisor resumes it in a window.
  if (flags.child) ::raise(SIGSTOP);
  // A best-effort guest gives the devices back at its next boundary on any
  // notice, whatever its deadline (it has no progress to make in a grace: it
  // runs only in windows), and when the host has finished.
  omni::PreemptionMonitor* monitor = (*rt)->preemption();
  omni::colocate::GuestLoopOptions lo;
  lo.max_units = flags.steps - *first;
  lo.wait_poll = absl::Milliseconds(5);
  lo.initial_unit_ns = static_cast<int64_t>(1e6 * flags.unit_ms);
  lo.max_wait = MaxWait(flags);
  omni::colocate::GuestLoopResult r;
  if (source != nullptr) {
    // Gated: the loop may be waiting for a window when told; a watcher
    // thread sets its stop.
    std::thread watcher([&] {
      while (!done.load() && !stop.load()) {
        if (monitor->pending() || host_gone()) stop.store(true);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
    r = omni::colocate::RunGuestLoop(**gate, *source, step, stop, lo);
    done.store(true);
    watcher.join();
  } else {
    // Ungated (or the trainer of --pause): asked at each boundary, no thread.
    while (r.units < lo.max_units && !stop.load() && !monitor->pending() &&
           g_host_busy.load() == 0) {
      if (auto st = step(); !st.ok()) return Fail(st);
      ++r.units;
    }
  }
  if (log != nullptr) std::fclose(log);
  if (r.why == omni::colocate::GuestStop::kUnitFailed) return Fail(r.unit_status);
  if (!flags.child) PrintGateLine(r.units, r.stats, r.unit_probes, r.unit_forgiven);
  // Not worth waiting (--max-wait-s): the reason the Runtime's yield gives.
  std::string leave = "the host finished";
  if (r.why == omni::colocate::GuestStop::kHostBusy ||
      r.why == omni::colocate::GuestStop::kWaitedTooLong) {
    leave = BusyReason(r.why, r.no_window_before_ns, r.waited_ns, outlook(), r.stats,
                       r.unit_bound_ns, flags);
  } else if (g_host_busy.load() != 0) {
    leave = absl::StrFormat("the host is busy: its supervisor stopped waiting (--max-wait-s %g)",
                            flags.max_wait_s);
  }

  // ---- preempted, or the host finished first: save through the Runtime
  // (when the notice's deadline still allows it) and exit resumable
  if ((*rt)->step() < flags.steps) {
    if (!stopped.has_value()) {
      absl::StatusOr<omni::Decision> d = (*rt)->Yield(leave);
      if (!d.ok()) return Fail(d.status());
      stopped = *d;
    }
    if (auto st = (*rt)->Finish(); !st.ok()) return Fail(st);
    if (stopped->exit_code != omni::kExitPreempted) {
      std::fprintf(stderr, "colocate_guest: no time to save (%s); exiting %d\n",
                   stopped->reason.c_str(), stopped->exit_code);
      return stopped->exit_code;
    }
    auto digest = omni::torch_ext::ParamsXxh3(*model);
    if (!digest.ok()) return Fail(digest.status());
    std::fprintf(stderr,
                 "colocate_guest: saved step=%" PRId64
                 " params_xxh3=%s; exiting 75 (resumable): %s\n",
                 stopped->saved_step, omni::HexDigest(*digest).c_str(), stopped->reason.c_str());
    return omni::kExitPreempted;
  }
  if (auto st = (*rt)->Finish(); !st.ok()) return Fail(st);
  auto digest = omni::torch_ext::ParamsXxh3(*model);
  if (!digest.ok()) return Fail(digest.status());
  std::printf("final step=%" PRId64 " params_xxh3=%s loss=%.6f\n", (*rt)->step(),
              omni::HexDigest(*digest).c_str(), static_cast<double>(last_loss));
  return 0;
}

// The weight of the session `pid` ("self" or a number) runs at, as a nice
// value (autogroup; best effort: absent without autogroups, and a change is
// refused within 100 ms of the last one without CAP_SYS_ADMIN).
void SetSessionNice(const std::string& pid, int nice) {
  const std::string path = "/proc/" + pid + "/autogroup";
  if (FILE* group = std::fopen(path.c_str(), "w")) {
    std::fprintf(group, "%d", nice);
    std::fclose(group);
  }
}

// Exits with `code` once stdout and stderr are flushed, without running
// the static destructors: LibTorch's take 0.2-0.5 s of CPU at exit here (its
// dispatcher deregisters every operator, and a forked process faults in the
// pages it frees), all of it on the host's core after the guest has yielded
// (the supervisor's part in the real-time class). Everything that writes a
// file (the Runtime, the logs) is closed by then, in Run's or Supervise's
// scope.
[[noreturn]] void ExitNow(int code) {
  std::fflush(nullptr);
  std::_Exit(code);
}

// --pause: the supervisor of the trainer child `child` (stopped by itself
// once ready). Returns the child's exit code.
int Supervise(const Flags& flags, pid_t child) {
  int st = 0;
  const auto finish_child = [&](int sig) {
    // Its save gets the session's normal weight back: at nice 19 a save on
    // a loaded machine could starve past the notice's deadline.
    SetSessionNice(std::to_string(child), 0);
    if (sig != 0) ::kill(child, sig);
    ::kill(child, SIGCONT);
    // Nothing is urgent after that: the real-time class is given up, so
    // that the wait and the exit never hold the host's core.
    sched_param idle = {};
    ::sched_setscheduler(0, SCHED_IDLE, &idle);
    ::waitpid(child, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
  };
  omni::colocate::GateOptions go;
  go.guard = absl::Microseconds(static_cast<int64_t>(1e3 * flags.guard_ms));
  // The yield it promises: the host's close wakes this loop at once (the
  // channel's doorbell; it reads the notices itself, no watcher thread); the
  // stop takes a fraction of a millisecond when the guest is on a core.
  go.miss_tolerance = absl::Nanoseconds(static_cast<int64_t>(1e6 * flags.yield_bound_ms));
  auto gate = omni::colocate::GuestGate::Create(go);
  // Attached before the trainer is ready: its start (a checkpoint restored
  // in the idle class on the host's busy core) can outlast the host, whose
  // channel is then gone; attached, that is the host finishing (the child
  // saves and exits 75), not a missing host (exit 1; the demo saw it).
  absl::StatusOr<std::unique_ptr<omni::colocate::ChannelWindowSource>> source =
      gate.ok() ? Attach(flags, gate->get(), /*watcher=*/false) : gate.status();
  // Ready, the trainer has stopped itself (a child told to save before then
  // would stop on its way and never exit).
  for (;;) {
    if (::waitpid(child, &st, WUNTRACED) == child) break;
    if (errno != EINTR) {
      return Fail(absl::InternalError(absl::StrCat("waitpid(", child, "): errno ", errno)));
    }
  }
  if (!WIFSTOPPED(st)) return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
  if (!source.ok()) {
    const int code = finish_child(SIGTERM);
    // Told to yield while it looked for the host (the host may have
    // finished before this slow start found it): preempted, not an error.
    if (g_signal.load() != 0) return code;
    return Fail(source.status());
  }
  std::FILE* runs = flags.runs_log.empty() ? nullptr : std::fopen(flags.runs_log.c_str(), "a");
  const omni::Clock* clock = omni::Clock::Real();
  const auto poll = absl::Nanoseconds(static_cast<int64_t>(1e6 * flags.poll_ms));
  omni::colocate::ProcessPauser pauser(child, /*is_child=*/true);
  rusage self0 = {};
  ::getrusage(RUSAGE_SELF, &self0);
  omni::colocate::PauseController ctl(gate->get(), absl::ToInt64Nanoseconds(poll),
                                      flags.until_close);
  // The trainer's CPU time (all its threads), read at each resume, stop
  // signal and observed stop: what it really ran, and whether it ran after
  // the host's close (a stop is observed only once the stopped threads get a
  // core again, which a woken host may keep for a while). -1: unreadable.
  const auto cpu_ns = [&]() -> int64_t { return pauser.CpuNanos().value_or(-1); };
  struct RunRecord {
    int64_t resume_ns = 0, cpu_resume_ns = 0;
    int64_t close_ns = 0, woke_ns = 0, signal_ns = 0, cpu_signal_ns = 0;  // at the stop
  } run;
  int64_t resumes = 0, run_ns = 0, woke_ns = clock->NowNanos(), notice_checked_ns = 0, turns = 0;
  const auto end_run = [&](int64_t end_ns) {
    run_ns += end_ns - run.resume_ns;
    if (runs != nullptr) {
      // close_ns: the host's close of the window it ran in (0: stopped before
      // one); woke_ns: when this loop woke for the stop; signal_ns: SIGSTOP
      // sent; cpu_*: the trainer's CPU clock (-1: unreadable).
      std::fprintf(runs,
                   "{\"resume_ns\":%" PRId64 ",\"stop_ns\":%" PRId64 ",\"close_ns\":%" PRId64
                   ",\"woke_ns\":%" PRId64 ",\"signal_ns\":%" PRId64 ",\"cpu_resume_ns\":%" PRId64
                   ",\"cpu_signal_ns\":%" PRId64 ",\"cpu_stop_ns\":%" PRId64 "}\n",
                   run.resume_ns, end_ns, run.close_ns, run.woke_ns, run.signal_ns,
                   run.cpu_resume_ns, run.cpu_signal_ns, cpu_ns());
    }
  };
  int forward = SIGTERM;  // how the child is told to save and exit
  absl::Status error;
  const absl::Duration max_wait = MaxWait(flags);
  int64_t waiting_since = clock->NowNanos();  // the trainer's last stop (or the start)
  for (;;) {
    if (::waitpid(child, &st, WNOHANG) == child) {  // it finished its steps
      if (ctl.running()) end_run(clock->NowNanos());
      if (runs != nullptr) std::fclose(runs);
      PrintGateLine(resumes, (*gate)->Stats());
      return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
    }
    if (g_signal.load() != 0 || (*source)->Stats().writer_closed) break;
    // The notice file every 100 ms (the monitor's own poll), not at every
    // notice of the host.
    if (!flags.notice_file.empty() && woke_ns - notice_checked_ns >= 100'000'000) {
      notice_checked_ns = woke_ns;
      if (::access(flags.notice_file.c_str(), F_OK) == 0) {
        forward = 0;  // the child reads the notice itself
        break;
      }
    }
    const omni::colocate::OpenWindow window = (*source)->Current();
    switch (ctl.Tick(window)) {
      case omni::colocate::PauseController::Action::kResume: {
        run = RunRecord{clock->NowNanos(), cpu_ns()};
        absl::StatusOr<absl::Duration> r = pauser.Resume();
        if (!r.ok()) error = r.status();
        ctl.Resumed();
        ++resumes;
        break;
      }
      case omni::colocate::PauseController::Action::kPause: {
        run.woke_ns = woke_ns;
        if (!(*gate)->ClosedAt(ctl.window_id(), &run.close_ns)) run.close_ns = 0;
        run.cpu_signal_ns = cpu_ns();
        const int64_t sent = clock->NowNanos();
        run.signal_ns = sent;
        absl::StatusOr<absl::Duration> r = pauser.Pause();
        if (!r.ok()) error = r.status();
        const int64_t stopped = sent + (r.ok() ? absl::ToInt64Nanoseconds(*r) : 0);
        ctl.Paused(stopped);
        end_run(stopped);
        waiting_since = stopped;
        break;
      }
      case omni::colocate::PauseController::Action::kNone:
        break;
    }
    if (!error.ok()) break;
    absl::Duration wait = flags.until_close || !ctl.running() ? absl::Milliseconds(100) : poll;
    if (!ctl.running() && max_wait != absl::InfiniteDuration()) {
      // Waiting for a window (--max-wait-s): is it worth it?
      const int64_t now = clock->NowNanos();
      const int64_t before = window.open ? 0 : (*source)->NoWindowBeforeNs();
      if (auto why = omni::colocate::StopWaiting(now, waiting_since, before, max_wait)) {
        std::fprintf(stderr, "colocate_guest: %s; the trainer saves\n",
                     BusyReason(*why, before, now - waiting_since, (*source)->Outlook(),
                                (*gate)->Stats(), absl::ToInt64Nanoseconds(poll), flags)
                         .c_str());
        forward = SIGUSR2;  // the trainer's OnHostBusy
        break;
      }
      wait = std::min(wait, max_wait - absl::Nanoseconds(now - waiting_since));
    }
    // Running to the close, only an open or a close matters (the source wakes
    // this wait at once); otherwise the shrinking remainder is looked at
    // every poll while the guest runs.
    (*source)->WaitForChange(wait);
    woke_ns = clock->NowNanos();
    ++turns;
  }
  // Preempted, or the host finished: the child runs on to save and exit.
  const bool real_time = ::sched_getscheduler(0) == SCHED_FIFO;
  if (ctl.running()) end_run(clock->NowNanos());
  if (runs != nullptr) std::fclose(runs);
  PrintGateLine(resumes, (*gate)->Stats());
  rusage self = {};
  ::getrusage(RUSAGE_SELF, &self);
  const auto ms = [](const rusage& r) {
    return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1e3 +
           static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e3;
  };
  // Its CPU time while it watched (start-up excluded), and whether it ran in
  // the real-time class.
  // Its wake-ups: the loop's turns and the context switches it made.
  std::fprintf(stderr,
               "colocate_guest: supervisor resumes=%" PRId64
               " run_ms=%.1f cpu_ms=%.1f rt=%d turns=%" PRId64 " switches=%ld wakeups=%" PRId64
               " read_errors=%" PRId64 "\n",
               resumes, static_cast<double>(run_ns) / 1e6, ms(self) - ms(self0), real_time ? 1 : 0,
               turns, (self.ru_nvcsw + self.ru_nivcsw) - (self0.ru_nvcsw + self0.ru_nivcsw),
               (*source)->Stats().wakeups, (*source)->Stats().read_errors);
  const int code = finish_child(forward);
  if (!error.ok()) return Fail(error);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!Parse(argc, argv, flags)) {
    std::fprintf(
        stderr,
        "usage: colocate_guest --ckpt-dir DIR [--channel NAME | --store URL\n"
        "  [--store-prefix P]] [--steps N] [--seed S]\n"
        "  [--hidden H] [--batch B] [--guard-ms G] [--unit-ms U] [--notice-file F]\n"
        "  [--log PATH] [--attach-s S] [--poll-ms P] [--kinds K1,K2|all]\n"
        "  [--yield-bound-ms B] [--max-wait-s S]\n"
        "  (--pause [--until-close] [--normal-class] first: stop/continue the trainer\n"
        "   by window; it runs in SCHED_IDLE in a session of its own unless --normal-class)\n"
        "  [--runs-log PATH]\n");
    return 2;
  }
  if (flags.pause) {
    // Before the fork: a signal that arrives early is still the supervisor's.
    struct sigaction sa = {};
    sa.sa_handler = OnSignal;
    for (int sig : {SIGTERM, SIGINT, SIGUSR1}) ::sigaction(sig, &sa, nullptr);
    const pid_t child = ::fork();
    if (child < 0) return Fail(absl::InternalError(absl::StrCat("fork: errno ", errno)));
    if (child > 0) {
      // The supervisor must stop the guest as soon as a window closes, on
      // cores the host and the guest keep busy: the real-time class when
      // allowed (it sleeps but for a few microseconds per notice), else as is.
      sched_param rt = {};
      rt.sched_priority = 1;
      ::sched_setscheduler(0, SCHED_FIFO, &rt);
      ExitNow(Supervise(flags, child));
    }
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never left stopped without its supervisor
    struct sigaction busy = {};
    busy.sa_handler = OnHostBusy;
    ::sigaction(SIGUSR2, &busy, nullptr);
    if (!flags.normal_class) {
      // The trainer in the idle class: a host thread that wakes on the
      // guest's core (its data stall ends) preempts it at once, before its
      // close notice reaches the supervisor; in the normal class the host may
      // wait up to a scheduler tick for the guest's turn to end.
      sched_param idle = {};
      ::sched_setscheduler(0, SCHED_IDLE, &idle);
      // And a session of its own: the kernel schedules a session as one
      // group (autogroup), and a guest in the host's group would spend the
      // host's share of the core in the host's idle time, so that the woken
      // host waits for other sessions' work (a container has its own cgroup
      // for the same reason). docs/colocation.md, "Why a yield looked slow".
      ::setsid();
      // The session's group at the lowest weight (autogroup nice 19: 15
      // against the host's 1024; raising it needs no privilege): SCHED_IDLE
      // acts only inside a group, so without this the guest's group is an
      // equal competitor of the host's at the group level, and a host thread
      // woken on the guest's core waits for the guest's slice. Best effort:
      // without autogroups (a kernel without them, or cgroups instead) the
      // file is absent and the operator's cgroup settings decide.
      SetSessionNice("self", 19);
    }
    flags.pause = false;
    flags.child = true;
  }
  int code = 1;
  try {
    code = Run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "colocate_guest: error: %s\n", e.what());
  }
  ExitNow(code);
}
