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
#include <torch/torch.h>

#include <atomic>
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
#include "omni/checkpoint.h"
#include "omni/colocate_channel.h"
#include "omni/colocate_guest.h"
#include "omni/hash.h"
#include "omni/preemption.h"
#include "omni/state.h"
#include "omni/torch/params.h"
#include "omni/torch/state.h"

namespace {

struct Flags {
  std::string channel, ckpt_dir, notice_file, log;
  int64_t steps = 1000, seed = 1, hidden = 128, batch = 64;
  double guard_ms = 2;
  double unit_ms = 10;   // the step's cost bound until one was measured
  double attach_s = 30;  // wait this long for the host's channel to appear
};

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "colocate_guest: %s\n", st.ToString().c_str());
  return 1;
}

bool Parse(int argc, char** argv, Flags& f) {
  const std::map<std::string, std::string*> text = {{"--channel", &f.channel},
                                                    {"--ckpt-dir", &f.ckpt_dir},
                                                    {"--notice-file", &f.notice_file},
                                                    {"--log", &f.log}};
  const std::map<std::string, int64_t*> ints = {
      {"--steps", &f.steps}, {"--seed", &f.seed}, {"--hidden", &f.hidden}, {"--batch", &f.batch}};
  const std::map<std::string, double*> reals = {
      {"--guard-ms", &f.guard_ms}, {"--unit-ms", &f.unit_ms}, {"--attach-s", &f.attach_s}};
  for (int i = 1; i + 1 < argc; i += 2) {
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
  return argc % 2 == 1 && !f.ckpt_dir.empty() && f.steps > 0;
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
  for (auto until = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(static_cast<int64_t>(1e3 * flags.attach_s));
       !flags.channel.empty() && !source;) {
    auto opened = omni::colocate::ChannelWindowSource::Open(flags.channel, gate->get());
    if (opened.ok()) {
      source = *std::move(opened);
    } else if (!absl::IsNotFound(opened.status()) || std::chrono::steady_clock::now() > until) {
      return Fail(opened.status());
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
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
  std::fprintf(stderr,
               "colocate_guest: units=%" PRId64 " waits=%" PRId64 " yields=%" PRId64
               " yield_p99_ms=%.3f yield_max_ms=%.3f deadline_misses=%" PRId64 "\n",
               r.units, r.stats.waits, r.stats.yields, r.stats.yield_p99_ns / 1e6,
               r.stats.yield_max_ns / 1e6, r.stats.deadline_misses);

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

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!Parse(argc, argv, flags)) {
    std::fprintf(stderr,
                 "usage: colocate_guest --ckpt-dir DIR [--channel NAME] [--steps N] [--seed S]\n"
                 "  [--hidden H] [--batch B] [--guard-ms G] [--unit-ms U] [--notice-file F]\n"
                 "  [--log PATH]"
                 "  [--attach-s S]\n");
    return 2;
  }
  try {
    return Run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "colocate_guest: error: %s\n", e.what());
  }
  return 1;
}
