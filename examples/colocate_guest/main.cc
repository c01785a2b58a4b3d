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
// through its CheckpointManager and exits 75 ("preempted, resumable"), or 76
// when not even a save fits the notice's deadline; started again with the same
// flags it resumes bit-exactly. Without --channel it trains ungated (the
// baselines: plain time sharing, or SCHED_IDLE set by its launcher).
// Last line of stdout: final step=N params_xxh3=H loss=L
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "omni/checkpoint.h"
#include "omni/colocate_channel.h"
#include "omni/colocate_guest.h"
#include "omni/colocate_pause.h"
#include "omni/hash.h"
#include "omni/preemption.h"
#include "omni/state.h"
#include "omni/torch/params.h"
#include "omni/torch/state.h"

namespace {

struct Flags {
  std::string channel, ckpt_dir, notice_file, log, runs_log, kinds = "all";
  int64_t steps = 1000, seed = 1, hidden = 128, batch = 64;
  double guard_ms = 2;
  double unit_ms = 10;        // the step's cost bound until one was measured
  double attach_s = 30;       // wait this long for the host's channel to appear
  double poll_ms = 0.5;       // how often an open window's remainder is refreshed
  double yield_bound_ms = 1;  // --pause: a stop later than this after a close is a miss
  bool pause = false;         // supervisor + stopped/continued trainer child
  bool until_close = false;   // --pause: run to the close, not to the claimed remainder
  bool child = false;         // (internal) the trainer child of --pause
};

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "colocate_guest: %s\n", st.ToString().c_str());
  return 1;
}

bool Parse(int argc, char** argv, Flags& f) {
  const std::map<std::string, std::string*> text = {
      {"--channel", &f.channel}, {"--ckpt-dir", &f.ckpt_dir}, {"--notice-file", &f.notice_file},
      {"--log", &f.log},         {"--runs-log", &f.runs_log}, {"--kinds", &f.kinds}};
  const std::map<std::string, int64_t*> ints = {
      {"--steps", &f.steps}, {"--seed", &f.seed}, {"--hidden", &f.hidden}, {"--batch", &f.batch}};
  const std::map<std::string, double*> reals = {{"--guard-ms", &f.guard_ms},
                                                {"--unit-ms", &f.unit_ms},
                                                {"--attach-s", &f.attach_s},
                                                {"--poll-ms", &f.poll_ms},
                                                {"--yield-bound-ms", &f.yield_bound_ms}};
  int i = 1;
  for (; i < argc && argv[i][0] == '-' && argv[i][1] == '-' &&
         (std::string(argv[i]) == "--pause" || std::string(argv[i]) == "--until-close");
       ++i) {
    (std::string(argv[i]) == "--pause" ? f.pause : f.until_close) = true;
  }
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
         (!f.pause || !f.channel.empty());
}

absl::StatusOr<std::unique_ptr<omni::colocate::ChannelWindowSource>> Attach(
    const Flags& flags, omni::colocate::GuestGate* gate) {
  absl::StatusOr<uint32_t> kinds = omni::colocate::ParseKinds(flags.kinds);
  if (!kinds.ok()) return kinds.status();
  omni::colocate::ChannelSourceOptions so;
  so.poll = absl::Nanoseconds(static_cast<int64_t>(1e6 * flags.poll_ms));
  so.kinds = *kinds;
  for (auto until = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(static_cast<int64_t>(1e3 * flags.attach_s));
       ;) {
    auto opened = omni::colocate::ChannelWindowSource::Open(flags.channel, gate, so);
    if (opened.ok() || !absl::IsNotFound(opened.status()) ||
        std::chrono::steady_clock::now() > until) {
      return opened;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void PrintGateLine(int64_t units, const omni::colocate::GateStats& s) {
  std::fprintf(stderr,
               "colocate_guest: units=%" PRId64 " waits=%" PRId64 " yields=%" PRId64
               " yield_p99_ms=%.3f yield_max_ms=%.3f deadline_misses=%" PRId64 " overruns=%" PRId64
               "\n",
               units, s.waits, s.yields, s.yield_p99_ns / 1e6, s.yield_max_ns / 1e6,
               s.deadline_misses, s.overruns);
}

int Run(const Flags& flags) {
  omni::PreemptionOptions po;  // first: a SIGTERM during start-up is a preemption too
  po.notice_file = flags.notice_file;
  auto monitor = omni::PreemptionMonitor::Create(po);
  if (!monitor.ok()) return Fail(monitor.status());
  torch::set_num_threads(1);
  torch::manual_seed(static_cast<uint64_t>(flags.seed));

  // ---- the model, its optimizer and the whole state, by key
  torch::nn::Sequential model(torch::nn::Linear(32, flags.hidden), torch::nn::Tanh(),
                              torch::nn::Linear(flags.hidden, flags.hidden), torch::nn::Tanh(),
                              torch::nn::Linear(flags.hidden, 1));
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-3));
  const torch::Tensor teacher = torch::randn({32, 1});
  struct Progress {
    int64_t step = 0;
    float loss = 0;
  } progress;
  omni::torch_ext::ModuleState model_state(*model);
  omni::torch_ext::OptimizerState optim_state(optimizer);
  omni::torch_ext::RngState rng_state;  // the data come from the global generator
  omni::BytesState progress_state("progress", &progress, sizeof(progress));
  omni::StateRegistry state;
  for (auto [k, s] : {std::pair<const char*, omni::Stateful*>{"model", &model_state},
                      {"optim", &optim_state},
                      {"rng", &rng_state},
                      {"train", &progress_state}}) {
    if (auto st = state.Register(k, s); !st.ok()) return Fail(st);
  }
  omni::CheckpointOptions co;
  co.dir = flags.ckpt_dir;
  co.job_id = "colocate_guest";
  auto ckpt = omni::CheckpointManager::Open(co);
  if (!ckpt.ok()) return Fail(ckpt.status());
  if (auto r = (*ckpt)->Restore(state); r.ok()) {
    std::fprintf(stderr, "colocate_guest: resumed at step %" PRId64 "\n", progress.step);
  } else if (!absl::IsNotFound(r.status())) {
    return Fail(r.status());
  }

  // ---- one unit of work: a training step on a fresh synthetic batch
  std::FILE* log = flags.log.empty() ? nullptr : std::fopen(flags.log.c_str(), "a");
  const auto step = [&]() -> absl::Status {
    const int64_t t0 = omni::Clock::Real()->NowNanos();
    const torch::Tensor x = torch::randn({flags.batch, 32});
    const torch::Tensor y = torch::tanh(x.matmul(teacher));
    optimizer.zero_grad();
    torch::Tensor loss = torch::mse_loss(model->forward(x), y);
    loss.backward();
    optimizer.step();
    progress.loss = loss.item<float>();
    ++progress.step;
    if (log != nullptr) {
      std::fprintf(log, "{\"step\":%" PRId64 ",\"start_ns\":%" PRId64 ",\"end_ns\":%" PRId64 "}\n",
                   progress.step - 1, t0, omni::Clock::Real()->NowNanos());
    }
    return absl::OkStatus();
  };

  // ---- gate the units on the host's windows (or not, without --channel)
  omni::colocate::GateOptions go;
  go.guard = absl::Microseconds(static_cast<int64_t>(1e3 * flags.guard_ms));
  auto gate = omni::colocate::GuestGate::Create(go);
  if (!gate.ok()) return Fail(gate.status());
  std::unique_ptr<omni::colocate::ChannelWindowSource> source;
  if (!flags.channel.empty() && !flags.child) {
    auto attached = Attach(flags, gate->get());
    if (!attached.ok()) return Fail(attached.status());
    source = *std::move(attached);
  }
  // The trainer child of --pause: ready, it stops itself until the
  // supervisor resumes it in a window.
  if (flags.child) ::raise(SIGSTOP);
  // Stop at the next boundary on a preemption or when the host has finished.
  std::atomic<bool> stop{false}, done{false};
  std::thread watcher([&] {
    while (!done.load() && !stop.load()) {
      if ((*monitor)->pending() || (source && source->Stats().writer_closed)) stop.store(true);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  omni::colocate::GuestLoopOptions lo;
  lo.max_units = flags.steps - progress.step;
  lo.wait_poll = absl::Milliseconds(5);
  lo.initial_unit_ns = static_cast<int64_t>(1e6 * flags.unit_ms);
  omni::colocate::GuestLoopResult r;
  if (source) {
    r = omni::colocate::RunGuestLoop(**gate, *source, step, stop, lo);
  } else {
    while (r.units < lo.max_units && !stop.load()) {
      if (auto st = step(); !st.ok()) return Fail(st);
      ++r.units;
    }
  }
  done.store(true);
  watcher.join();
  if (log != nullptr) std::fclose(log);
  if (r.why == omni::colocate::GuestStop::kUnitFailed) return Fail(r.unit_status);
  if (!flags.child) PrintGateLine(r.units, r.stats);

  // ---- preempted, or the host finished first: save and exit resumable
  if (progress.step < flags.steps) {
    // Give the devices back as soon as a save allows: no further step.
    const omni::Cost never{std::numeric_limits<double>::infinity(), 0};
    omni::BoundaryDecision d = (*monitor)->AtBoundary(never, {0.05, 0.05});
    if (d.action == omni::BoundaryAction::kExitWithoutSave) {
      std::fprintf(stderr, "colocate_guest: no time to save; exiting 76\n");
      return omni::kExitPreemptedNoSave;
    }
    auto saved = (*ckpt)->Save(progress.step, state, {{"source", "colocate_guest"}});
    if (!saved.ok()) return Fail(saved.status());
    auto digest = omni::torch_ext::ParamsXxh3(*model);
    if (!digest.ok()) return Fail(digest.status());
    std::fprintf(stderr,
                 "colocate_guest: saved step=%" PRId64
                 " params_xxh3=%s; exiting 75 (resumable): %s\n",
                 progress.step, omni::HexDigest(*digest).c_str(),
                 d.reason.empty() ? "the host finished" : d.reason.c_str());
    return omni::kExitPreempted;
  }
  auto digest = omni::torch_ext::ParamsXxh3(*model);
  if (!digest.ok()) return Fail(digest.status());
  std::printf("final step=%" PRId64 " params_xxh3=%s loss=%.6f\n", progress.step,
              omni::HexDigest(*digest).c_str(), static_cast<double>(progress.loss));
  return 0;
}

std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal.store(sig); }

// --pause: the supervisor of the trainer child `child` (stopped by itself
// once ready). Returns the child's exit code.
int Supervise(const Flags& flags, pid_t child) {
  int st = 0;
  if (::waitpid(child, &st, WUNTRACED) != child) {
    return Fail(absl::InternalError(absl::StrCat("waitpid(", child, "): errno ", errno)));
  }
  if (!WIFSTOPPED(st)) return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
  const auto finish_child = [&](int sig) {
    if (sig != 0) ::kill(child, sig);
    ::kill(child, SIGCONT);
    ::waitpid(child, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
  };
  omni::colocate::GateOptions go;
  go.guard = absl::Microseconds(static_cast<int64_t>(1e3 * flags.guard_ms));
  // The yield it promises: the host's close wakes the watcher and this loop
  // at once (the channel's doorbell); the stop takes a fraction of a
  // millisecond when the guest is on a core.
  go.miss_tolerance = absl::Nanoseconds(static_cast<int64_t>(1e6 * flags.yield_bound_ms));
  auto gate = omni::colocate::GuestGate::Create(go);
  if (!gate.ok()) return finish_child(SIGTERM), Fail(gate.status());
  auto source = Attach(flags, gate->get());
  if (!source.ok()) return finish_child(SIGTERM), Fail(source.status());
  std::FILE* runs = flags.runs_log.empty() ? nullptr : std::fopen(flags.runs_log.c_str(), "a");
  const omni::Clock* clock = omni::Clock::Real();
  const auto poll = absl::Nanoseconds(static_cast<int64_t>(1e6 * flags.poll_ms));
  omni::colocate::ProcessPauser pauser(child, /*is_child=*/true);
  rusage self0 = {};
  ::getrusage(RUSAGE_SELF, &self0);
  omni::colocate::PauseController ctl(gate->get(), absl::ToInt64Nanoseconds(poll),
                                      flags.until_close);
  int64_t resumes = 0, run_start = 0, run_ns = 0;
  const auto end_run = [&](int64_t end_ns) {
    run_ns += end_ns - run_start;
    if (runs != nullptr) {
      std::fprintf(runs, "{\"resume_ns\":%" PRId64 ",\"stop_ns\":%" PRId64 "}\n", run_start,
                   end_ns);
    }
  };
  int forward = SIGTERM;  // how the child is told to save and exit
  absl::Status error;
  for (;;) {
    if (::waitpid(child, &st, WNOHANG) == child) {  // it finished its steps
      if (ctl.running()) end_run(clock->NowNanos());
      if (runs != nullptr) std::fclose(runs);
      PrintGateLine(resumes, (*gate)->Stats());
      return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
    }
    if (g_signal.load() != 0 || (*source)->Stats().writer_closed) break;
    if (!flags.notice_file.empty() && ::access(flags.notice_file.c_str(), F_OK) == 0) {
      forward = 0;  // the child reads the notice itself
      break;
    }
    switch (ctl.Tick((*source)->Current())) {
      case omni::colocate::PauseController::Action::kResume: {
        run_start = clock->NowNanos();
        absl::StatusOr<absl::Duration> r = pauser.Resume();
        if (!r.ok()) error = r.status();
        ctl.Resumed();
        ++resumes;
        break;
      }
      case omni::colocate::PauseController::Action::kPause: {
        const int64_t sent = clock->NowNanos();
        absl::StatusOr<absl::Duration> r = pauser.Pause();
        if (!r.ok()) error = r.status();
        const int64_t stopped = sent + (r.ok() ? absl::ToInt64Nanoseconds(*r) : 0);
        ctl.Paused(stopped);
        end_run(stopped);
        break;
      }
      case omni::colocate::PauseController::Action::kNone:
        break;
    }
    if (!error.ok()) break;
    // Running to the close, only an open or a close matters (the source wakes
    // this wait at once); otherwise the shrinking remainder is looked at
    // every poll while the guest runs.
    (*source)->WaitForChange(flags.until_close || !ctl.running() ? absl::Milliseconds(20) : poll);
  }
  // Preempted, or the host finished: the child runs on to save and exit.
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
  std::fprintf(stderr,
               "colocate_guest: supervisor resumes=%" PRId64 " run_ms=%.1f cpu_ms=%.1f rt=%d\n",
               resumes, static_cast<double>(run_ns) / 1e6, ms(self) - ms(self0),
               ::sched_getscheduler(0) == SCHED_FIFO ? 1 : 0);
  const int code = finish_child(forward);
  if (!error.ok()) return Fail(error);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!Parse(argc, argv, flags)) {
    std::fprintf(stderr,
                 "usage: colocate_guest --ckpt-dir DIR [--channel NAME] [--steps N] [--seed S]\n"
                 "  [--hidden H] [--batch B] [--guard-ms G] [--unit-ms U] [--notice-file F]\n"
                 "  [--log PATH] [--attach-s S] [--poll-ms P] [--kinds K1,K2|all]\n"
                 "  [--yield-bound-ms B]\n"
                 "  (--pause [--until-close] first: stop/continue the trainer by window)\n"
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
      return Supervise(flags, child);
    }
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never left stopped without its supervisor
    flags.pause = false;
    flags.child = true;
  }
  try {
    return Run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "colocate_guest: error: %s\n", e.what());
  }
  return 1;
}
