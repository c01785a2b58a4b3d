// omni_train: a small LibTorch trainer shaped like a real multimodal one,
// instrumented with Omni telemetry. See --help and data.h / model.h.
//
// Per step:  data_wait (pop a prepared batch from the loader thread)
//            compute   (forward + backward)
//            optimizer (AdamW step)
//            eval      (every --eval-every steps: nested compute for the
//                       forward pass over a held-out batch, then host-side
//                       scoring)
//            host      (loss.item(), logging)
//            checkpoint (every --ckpt-every steps, and when preempted)
//
// With --ckpt-dir the full state (parameters, AdamW moments, LR schedule,
// every RNG, the data sampler's cursor, the step) is checkpointed, and a run
// started again with the same flags resumes bit-exactly from the newest valid
// checkpoint. A PreemptionMonitor turns SIGTERM / SIGUSR1 / SIGINT and
// scheduler notices into a save at the last boundary before the deadline.
//
// With --store the process is one replica of an elastic data-parallel job
// (omni::ElasticGroup): it takes its share of each global batch, gradients
// are summed over the replicas with a Gloo allreduce (phase "comm"), and
// replicas may die, freeze or join at step boundaries; a step whose
// allreduce fails is not committed, the survivors agree on a new generation
// and the step is redone.
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "data.h"
#include "flags.h"
#include "model.h"
#include "omni/checkpoint.h"
#include "omni/clock.h"
#include "omni/elastic.h"
#include "omni/forecast.h"
#include "omni/hash.h"
#include "omni/phase.h"
#include "omni/preemption.h"
#include "omni/sampler.h"
#include "omni/sinks.h"
#include "omni/state.h"
#include "omni/telemetry.h"
#include "omni/torch/params.h"
#include "omni/torch/state.h"
#include "omni/torch/store.h"

namespace omni_train {
namespace {

constexpr int kPrefetchBatches = 2;
constexpr int kEvalSamples = 256;  // held-out set: eval steps are long, as in real jobs
constexpr int kBootstrapRounds = 1000;
constexpr int kTemperatures = 64;  // calibration sweep over [0.5, 2.5]
constexpr int kProgressEvery = 50;
constexpr int64_t kWarmupSteps = 20;

// Identifies the training configuration in checkpoints, so that a run never
// resumes from another configuration's state.
std::string JobId(const TrainFlags& f) {
  return absl::StrCat("omni_train seed=", f.seed, " batch=", f.batch, " lr=", f.lr,
                      " steps=", f.steps, f.text_only ? " text-only" : "",
                      f.dropout > 0 ? absl::StrCat(" dropout=", f.dropout) : "");
}

struct BatchTensors {
  torch::Tensor images;  // undefined when text-only
  torch::Tensor text;
};

BatchTensors ToTensors(Batch& b, const torch::Device& device) {
  BatchTensors t;
  if (!b.images.empty()) {
    t.images = torch::from_blob(b.images.data(), {b.size, kChannels, kImageSize, kImageSize},
                                torch::kFloat)
                   .to(device, /*non_blocking=*/false, /*copy=*/true);
  }
  t.text = torch::from_blob(b.text.data(), {b.size, kTextLen}, torch::kLong)
               .to(device, /*non_blocking=*/false, /*copy=*/true);
  return t;
}

struct EvalResult {
  double token_accuracy = 0;       // argmax == (noisy) target
  double clean_accuracy = 0;       // argmax == noise-free caption token
  double perplexity = 0;           // exp(mean NLL) against the targets
  double ece = 0;                  // expected calibration error, 10 bins
  double ci_low = 0, ci_high = 0;  // bootstrap 95% interval of clean accuracy
  double temperature = 1;          // calibration temperature minimizing the NLL
  double calibrated_perplexity = 0;
};

// Host-side scoring of eval logits [B, n, V] (CPU, double precision).
EvalResult ScoreEval(const torch::Tensor& logits_in, const torch::Tensor& targets_in,
                     const Batch& batch, const DataConfig& data, uint64_t seed) {
  const torch::Tensor logits = logits_in.to(torch::kCPU, torch::kFloat).contiguous();
  const torch::Tensor targets = targets_in.to(torch::kCPU, torch::kLong).contiguous();
  const int64_t b = logits.size(0), n = logits.size(1), v = logits.size(2);
  const float* lp = logits.data_ptr<float>();
  const int64_t* tp = targets.data_ptr<int64_t>();
  const int64_t offset = kTextLen - n;  // target j is caption token offset + j

  constexpr int kBins = 10;
  std::vector<double> bin_conf(kBins), bin_acc(kBins);
  std::vector<double> per_sample_clean(static_cast<size_t>(b));
  double nll = 0, correct = 0, clean = 0;
  for (int64_t i = 0; i < b; ++i) {
    const size_t si = static_cast<size_t>(i);
    const std::vector<int64_t> caption = CaptionOf(data, batch.labels[si], batch.quadrants[si]);
    double sample_clean = 0;
    for (int64_t j = 0; j < n; ++j) {
      const float* row = lp + (i * n + j) * v;
      const int64_t target = tp[i * n + j];
      int64_t best = 0;
      for (int64_t k = 1; k < v; ++k) best = row[k] > row[best] ? k : best;
      double denom = 0;
      for (int64_t k = 0; k < v; ++k) denom += std::exp(static_cast<double>(row[k] - row[best]));
      const double log_z = static_cast<double>(row[best]) + std::log(denom);
      nll += log_z - static_cast<double>(row[target]);
      const bool hit = best == target;
      correct += hit ? 1 : 0;
      sample_clean += best == caption[static_cast<size_t>(offset + j)] ? 1 : 0;
      const double conf = 1.0 / denom;  // softmax probability of the argmax
      const int bin = std::min(kBins - 1, static_cast<int>(conf * kBins));
      bin_conf[static_cast<size_t>(bin)] += conf;
      bin_acc[static_cast<size_t>(bin)] += hit ? 1 : 0;
    }
    per_sample_clean[si] = sample_clean / static_cast<double>(n);
    clean += sample_clean;
  }
  const double total = static_cast<double>(b * n);
  EvalResult r;
  r.token_accuracy = correct / total;
  r.clean_accuracy = clean / total;
  r.perplexity = std::exp(nll / total);
  for (int k = 0; k < kBins; ++k) {
    const size_t sk = static_cast<size_t>(k);
    r.ece += std::abs(bin_conf[sk] - bin_acc[sk]) / total;
  }

  // Bootstrap over samples (deterministic: a fixed LCG seeded by the run seed).
  uint64_t state = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  std::vector<double> means(kBootstrapRounds);
  for (double& m : means) {
    double s = 0;
    for (int64_t i = 0; i < b; ++i) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      s += per_sample_clean[static_cast<size_t>((state >> 33) % static_cast<uint64_t>(b))];
    }
    m = s / static_cast<double>(b);
  }
  std::sort(means.begin(), means.end());
  r.ci_low = means[static_cast<size_t>(0.025 * kBootstrapRounds)];
  r.ci_high = means[static_cast<size_t>(0.975 * kBootstrapRounds) - 1];

  // Temperature scaling: the temperature minimizing the held-out NLL.
  double best_nll = nll / total;
  for (int k = 0; k < kTemperatures; ++k) {
    const double temp = 0.5 + 2.0 * k / (kTemperatures - 1);
    double t_nll = 0;
    for (int64_t row = 0; row < b * n; ++row) {
      const float* x = lp + row * v;
      const double mx = *std::max_element(x, x + v);
      double denom = 0;
      for (int64_t c = 0; c < v; ++c) denom += std::exp((static_cast<double>(x[c]) - mx) / temp);
      t_nll += (mx - static_cast<double>(x[tp[row]])) / temp + std::log(denom);
    }
    t_nll /= total;
    if (t_nll < best_nll) {
      best_nll = t_nll;
      r.temperature = temp;
    }
  }
  r.calibrated_perplexity = std::exp(best_nll);
  return r;
}

// Names, dtypes and shapes of the parameters: replicas of another model are
// refused by the elastic group.
std::string ModelDigest(MultimodalLm& model) {
  omni::Xxh3 h;
  for (const auto& item : model->named_parameters()) {
    const std::string line =
        absl::StrCat(item.key(), " ", c10::toString(item.value().scalar_type()), " ",
                     c10::str(item.value().sizes()), "\n");
    h.Update(line.data(), line.size());
  }
  return omni::HexDigest(h.Digest());
}

std::string Hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

void LogChange(const omni::GroupChange& c, const char* why) {
  std::fprintf(stderr,
               "omni_train: elastic: %s: %s; agree %.1f ms, build %.1f ms, sync %.1f ms%s "
               "t_mono_ns=%" PRId64 "\n",
               why, c.generation.ToString().c_str(), c.agree_ms, c.build_ms, c.sync_ms,
               c.state_received ? absl::StrCat(", state (", c.state_bytes, " bytes, step ",
                                               c.completed, ") from rank ", c.source_rank)
                                      .c_str()
                                : "",
               omni::Clock::Real()->NowNanos());
}

absl::Status WriteParams(MultimodalLm& model, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (const auto& p : model->parameters()) {
    const torch::Tensor t = p.detach().to(torch::kCPU, torch::kFloat).contiguous();
    out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  }
  out.close();
  if (!out) return absl::PermissionDeniedError("cannot write --params-out " + path);
  return absl::OkStatus();
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "omni_train: %s\n", status.ToString().c_str());
  return 1;
}

absl::StatusOr<std::unique_ptr<omni::Store>> OpenStore(const std::string& uri) {
  if (auto st = omni::torch_ext::RegisterTcpStore(); !st.ok()) return st;
  return omni::OpenStore(uri);
}

// The training device. On CUDA only deterministic kernels run (and cuBLAS
// gets a fixed workspace, set in main() before CUDA starts), so that a run and
// its preempted-and-resumed twin stay bit-identical.
absl::StatusOr<torch::Device> TrainingDevice(const std::string& name) {
  const torch::Device device(name);
  if (!device.is_cuda()) return device;
  const int64_t visible = static_cast<int64_t>(torch::cuda::device_count());
  const int64_t index = device.has_index() ? device.index() : 0;
  if (index >= visible) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device ", name, ": ", visible, " CUDA device(s) visible to this LibTorch"));
  }
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  at::globalContext().setDeterministicCuDNN(true);
  at::globalContext().setBenchmarkCuDNN(false);
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

// The store prefix of a generation's stop agreement.
std::string StopPrefix(const omni::Generation& gen) { return gen.prefix() + "/stop/"; }

int Run(const TrainFlags& flags) {
  // A store that the preemption monitor polls for notices is opened before it
  // (and outlives it); otherwise the store is opened when joining the group.
  std::unique_ptr<omni::Store> store;
  if (!flags.notice_key.empty()) {
    absl::StatusOr<std::unique_ptr<omni::Store>> opened = OpenStore(flags.store);
    if (!opened.ok()) return Fail(opened.status());
    store = *std::move(opened);
  }
  // First, so that a signal during start-up is a preemption too (acted upon at
  // the first step boundary), not the default action.
  omni::PreemptionOptions preemption_options;
  preemption_options.notice_file = flags.notice_file;
  if (store) {
    preemption_options.notice_store = store.get();
    preemption_options.notice_key = flags.notice_key;
  }
  if (auto st = omni::ApplyEnvironment(preemption_options); !st.ok()) return Fail(st);
  absl::StatusOr<std::unique_ptr<omni::PreemptionMonitor>> monitor_or =
      omni::PreemptionMonitor::Create(preemption_options);
  if (!monitor_or.ok()) return Fail(monitor_or.status());
  omni::PreemptionMonitor& monitor = **monitor_or;

  torch::set_num_threads(flags.threads);
  torch::manual_seed(flags.seed);
  const absl::StatusOr<torch::Device> device_or = TrainingDevice(flags.device);
  if (!device_or.ok()) return Fail(device_or.status());
  const torch::Device device = *device_or;

  // ---- telemetry
  omni::TelemetryOptions options;
  options.source = "omni_train";
  options.stats.window = flags.window;
  options.step_log_path = flags.log_path;
  options.trace_path = flags.trace_path;
  options.window_channel_name = flags.window_channel;
  if (flags.eval_every > 0) {
    options.forecast.eval.every_steps = flags.eval_every;
    options.forecast.eval.offset = flags.eval_every - 1;
  }
  absl::StatusOr<std::unique_ptr<omni::Telemetry>> created = omni::Telemetry::Create(options);
  if (!created.ok()) return Fail(created.status());
  omni::Telemetry& tel = **created;
  if (!flags.forecast_path.empty()) {
    absl::StatusOr<std::unique_ptr<omni::ForecastSink>> sink =
        omni::MakeFileSink(flags.forecast_path);
    if (!sink.ok()) return Fail(sink.status());
    tel.AddSink(*std::move(sink));
  }

  // ---- model, optimizer, LR schedule, data
  ModelConfig model_config;
  model_config.vocab = kVocab;
  model_config.text_len = kTextLen;
  model_config.dropout = flags.dropout;
  MultimodalLm model(model_config);  // initialised on the CPU: the same on every device
  model->to(device);
  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(flags.lr).weight_decay(0.01));
  omni::torch_ext::WarmupCosineSchedule schedule(optimizer, flags.lr, kWarmupSteps, flags.steps);

  DataConfig data;
  data.seed = flags.seed;
  data.batch = flags.batch;
  data.text_only = flags.text_only;
  data.stall_scale = flags.stall_scale;

  omni::SamplerOptions sampler_options;
  sampler_options.dataset_size = kDatasetSize;
  sampler_options.global_batch = flags.batch;
  sampler_options.seed = flags.seed;
  absl::StatusOr<omni::DistributedSampler> sampler_or =
      omni::DistributedSampler::Create(sampler_options);
  if (!sampler_or.ok()) return Fail(sampler_or.status());
  omni::DistributedSampler& sampler = *sampler_or;

  DataConfig eval_data = data;
  eval_data.batch = kEvalSamples;
  Batch eval_batch = MakeBatch(eval_data, kEvalStream, 0, /*decode=*/false);
  const BatchTensors eval_tensors = ToTensors(eval_batch, device);

  // ---- the full training state, by key
  struct Progress {
    int64_t step = 0;  // steps completed
    float last_loss = 0;
    float first_loss = 0;
  } progress;
  omni::torch_ext::ModuleState model_state(*model);
  omni::torch_ext::OptimizerState optimizer_state(optimizer);
  omni::torch_ext::RngState rng_state;
  omni::BytesState progress_state("progress", &progress, sizeof(progress));
  omni::StateRegistry state;
  for (auto [name, object] :
       std::initializer_list<std::pair<const char*, omni::Stateful*>>{{"model", &model_state},
                                                                      {"optim", &optimizer_state},
                                                                      {"lr", &schedule},
                                                                      {"rng", &rng_state},
                                                                      {"data", &sampler},
                                                                      {"train", &progress_state}}) {
    if (auto st = state.Register(name, object); !st.ok()) return Fail(st);
  }

  std::unique_ptr<omni::CheckpointManager> ckpt;
  if (!flags.ckpt_dir.empty()) {
    omni::CheckpointOptions co;
    co.dir = flags.ckpt_dir;
    co.keep_last = flags.keep;
    co.job_id = JobId(flags);
    absl::StatusOr<std::unique_ptr<omni::CheckpointManager>> opened =
        omni::CheckpointManager::Open(co);
    if (!opened.ok()) return Fail(opened.status());
    ckpt = *std::move(opened);
    absl::StatusOr<omni::CheckpointManager::RestoreResult> restored = ckpt->Restore(state);
    if (restored.ok()) {
      for (const std::string& why : restored->skipped) {
        std::fprintf(stderr, "omni_train: skipped checkpoint: %s\n", why.c_str());
      }
      if (!flags.quiet) {
        std::printf("resumed from %s (step %" PRId64 ")\n", restored->info.path.c_str(),
                    progress.step);
      }
    } else if (!absl::IsNotFound(restored.status())) {
      return Fail(restored.status());
    }
  }

  std::FILE* loss_log = nullptr;
  if (!flags.loss_log.empty()) {
    loss_log = std::fopen(flags.loss_log.c_str(), "a");
    if (loss_log == nullptr) {
      return Fail(absl::PermissionDeniedError("cannot open --loss-log " + flags.loss_log));
    }
  }
  const auto close_loss_log = [&] {
    if (loss_log != nullptr) std::fclose(loss_log);
    loss_log = nullptr;
  };

  // ---- elastic data parallelism: join the group; a replica that is behind
  // (or new) receives the replicated state from the most advanced one.
  std::unique_ptr<omni::ElasticGroup> group;
  omni::StateRegistry replicated;  // everything but this replica's RNGs
  if (!flags.store.empty()) {
    for (auto [name, object] : std::initializer_list<std::pair<const char*, omni::Stateful*>>{
             {"model", &model_state},
             {"optim", &optimizer_state},
             {"lr", &schedule},
             {"data", &sampler},
             {"train", &progress_state}}) {
      if (auto st = replicated.Register(name, object); !st.ok()) return Fail(st);
    }
    if (!store) {
      absl::StatusOr<std::unique_ptr<omni::Store>> opened = OpenStore(flags.store);
      if (!opened.ok()) return Fail(opened.status());
      store = *std::move(opened);
    }
    omni::ElasticOptions eo;
    eo.membership.job_id = JobId(flags);
    eo.membership.model_digest = ModelDigest(model);
    eo.membership.self.id = flags.replica_id;
    eo.membership.self.host = Hostname();
    eo.membership.self.rack = Env("OMNI_RACK");
    eo.membership.self.switch_name = Env("OMNI_SWITCH");
    eo.membership.min_replicas = flags.min_replicas;
    eo.membership.max_replicas = flags.max_replicas;
    eo.membership.heartbeat = absl::Milliseconds(flags.heartbeat_ms);
    eo.membership.peer_timeout = absl::Milliseconds(flags.peer_timeout_ms);
    absl::StatusOr<std::unique_ptr<omni::ElasticGroup>> created_group =
        omni::ElasticGroup::Create(*store, eo, replicated);
    if (!created_group.ok()) return Fail(created_group.status());
    group = *std::move(created_group);
    absl::StatusOr<omni::GroupChange> started = group->Start(progress.step);
    if (!started.ok()) return Fail(started.status());
    LogChange(*started, "joined");
  }
  // Micro-batch of a replica: a full group takes its share in one.
  const int64_t micro_batch = (flags.batch + flags.max_replicas - 1) / flags.max_replicas;
  std::vector<float> flat;  // gradients + loss, summed over the replicas

  const int64_t start_step = progress.step;
  std::unique_ptr<DataLoader> loader;
  if (!group) {
    loader = std::make_unique<DataLoader>(data, sampler, sampler.cursor(), flags.steps - start_step,
                                          kPrefetchBatches);
  }

  // Saves the full state as of `progress.step` (synchronously, or in the
  // background for periodic checkpoints with --async-ckpt).
  double last_save_s = 0;
  const auto save = [&](bool background) -> absl::Status {
    const std::map<std::string, std::string> meta = {{"source", "omni_train"},
                                                     {"steps_total", std::to_string(flags.steps)}};
    if (background) return ckpt->SaveAsync(progress.step, state, meta).status();
    if (auto st = ckpt->WaitForPending(); !st.ok()) return st;
    absl::StatusOr<omni::SaveStats> stats = ckpt->Save(progress.step, state, meta);
    if (!stats.ok()) return stats.status();
    last_save_s = stats->write_s + stats->snapshot_s;
    return absl::OkStatus();
  };
  // Until a save has been measured: a fixed cost for the fsyncs and renames
  // plus the state at a conservative 100 MB/s, with a 50% standard deviation.
  size_t state_bytes = 0;
  for (const auto& p : model->parameters()) state_bytes += 3 * p.nbytes();  // + AdamW moments
  const double unmeasured_save_s = 0.05 + static_cast<double>(state_bytes) / 100e6;
  const omni::Cost unmeasured_save{unmeasured_save_s, 0.5 * unmeasured_save_s};
  // The next step is costed at the worst duration this process has seen for
  // its kind (a data stall or an eval must not make the job miss its
  // deadline); the save at its mean + k·stddev (PreemptionMonitor adds k·σ).
  double worst_step_s = 0, worst_eval_step_s = 0;
  const auto is_eval = [&](int64_t s) {
    return flags.eval_every > 0 && s % flags.eval_every == flags.eval_every - 1;
  };
  const auto costs = [&](int64_t next_step) {
    const omni::StatsSnapshot snap = tel.Snapshot();
    // An eval step not yet seen has an unknown cost: do not start it.
    const double unknown = std::numeric_limits<double>::infinity();
    omni::Cost step{
        is_eval(next_step) ? (worst_eval_step_s > 0 ? worst_eval_step_s : unknown) : worst_step_s,
        0};
    omni::Cost write;
    for (const auto& row : snap.rows) {
      if (row.name == "checkpoint") write = {row.summary.mean / 1e9, row.summary.stddev / 1e9};
    }
    if (write.mean_s == 0) write = unmeasured_save;  // no checkpoint measured yet
    return std::make_pair(step, write);
  };

  // In --store mode: the agreement on the stop boundary, per generation.
  std::unique_ptr<omni::Store> stop_store;
  std::unique_ptr<omni::StopCoordinator> stop;
  int64_t stop_generation = -1;
  bool leaving = false;        // --leave-on-preempt: a leave is requested
  bool left_group = false;     // ... and has taken effect
  bool leave_refused = false;  // ... and refused (min_replicas): the job stops

  // ---- training loop
  const auto t0 = std::chrono::steady_clock::now();
  int64_t completed = start_step;
  int exit_code = -1;      // set when preempted
  bool recovered = false;  // the next commit is the first after a recovery
  for (int64_t step = start_step; step < flags.steps && exit_code < 0; step = completed) {
    omni::StepScope step_scope(tel, step);
    const auto step_t0 = std::chrono::steady_clock::now();

    BatchTensors batch;
    {
      omni::PhaseScope p(tel, omni::phase::kDataWait);
      if (group) {
        // This replica's share of the global batch at the committed cursor;
        // committed only once the step's allreduce succeeded.
        const omni::Generation gen = group->generation();
        absl::StatusOr<std::vector<int64_t>> indices =
            sampler.BatchAt(sampler.cursor(), gen.rank, gen.size());
        if (!indices.ok()) return Fail(indices.status());
        Batch b = MakeBatchOf(data, kTrainStream, step, *indices, /*decode=*/true);
        batch = ToTensors(b, device);
      } else {
        absl::StatusOr<Batch> next = loader->Next();
        if (!next.ok()) return Fail(next.status());
        batch = ToTensors(*next, device);
        sampler.Commit();  // consumed
      }
    }

    float loss_value = 0;
    {
      omni::PhaseScope p(tel, omni::phase::kCompute);
      optimizer.zero_grad();
      if (group) {
        // Sum over micro-batches of mean-token loss x (samples / global
        // batch): summed over the replicas, the global batch's mean loss.
        const int64_t n = batch.text.size(0);
        double local = 0;
        for (int64_t s0 = 0; s0 < n; s0 += micro_batch) {
          const int64_t len = std::min(micro_batch, n - s0);
          torch::Tensor images =
              batch.images.defined() ? batch.images.narrow(0, s0, len) : torch::Tensor();
          auto [logits, targets] = model->NextTokenLogits(images, batch.text.narrow(0, s0, len));
          torch::Tensor l = NextTokenLoss(logits, targets) *
                            (static_cast<double>(len) / static_cast<double>(flags.batch));
          l.backward();
          local += l.item<double>();
        }
        loss_value = static_cast<float>(local);
      } else {
        auto [logits, targets] = model->NextTokenLogits(batch.images, batch.text);
        torch::Tensor loss = NextTokenLoss(logits, targets);
        loss.backward();
        loss_value = loss.item<float>();
      }
    }

    if (group) {
      absl::Status reduced;
      {
        omni::PhaseScope p(tel, omni::phase::kComm);
        size_t total = 0;
        for (auto& prm : model->parameters()) total += static_cast<size_t>(prm.numel());
        flat.assign(total + 1, 0.0F);
        size_t at = 0;
        for (auto& prm : model->parameters()) {
          const auto numel = static_cast<size_t>(prm.numel());
          if (prm.grad().defined()) {
            const torch::Tensor g = prm.grad().to(torch::kCPU).contiguous();
            std::copy_n(g.data_ptr<float>(), numel, flat.data() + at);
          }
          at += numel;
        }
        flat[total] = loss_value;
        reduced = group->AllReduce(flat.data(), flat.size(), omni::DataType::kFloat32,
                                   omni::ReduceOp::kSum);
        if (reduced.ok()) {
          at = 0;
          for (auto& prm : model->parameters()) {
            const auto numel = static_cast<size_t>(prm.numel());
            if (!prm.grad().defined()) prm.mutable_grad() = torch::zeros_like(prm);
            prm.grad().copy_(torch::from_blob(flat.data() + at, prm.sizes(), torch::kFloat));
            at += numel;
          }
          loss_value = flat[total];
        }
      }
      if (!reduced.ok()) {
        // Nothing of this step is committed: agree on the survivors, rebuild,
        // re-synchronise, and redo the step.
        std::fprintf(stderr,
                     "omni_train: elastic: step %" PRId64 " failed: %s t_mono_ns=%" PRId64 "\n",
                     step, reduced.ToString().c_str(), omni::Clock::Real()->NowNanos());
        absl::StatusOr<omni::GroupChange> change = group->Recover(reduced, progress.step);
        if (!change.ok()) return Fail(change.status());
        LogChange(*change, "recovered");
        completed = progress.step;
        recovered = true;
        continue;
      }
      sampler.Commit();
    }

    {
      omni::PhaseScope p(tel, omni::phase::kOptimizer);
      schedule.Step();
      optimizer.step();
    }

    if (flags.eval_every > 0 && step % flags.eval_every == flags.eval_every - 1) {
      omni::PhaseScope eval_scope(tel, omni::phase::kEval);
      torch::Tensor logits, targets;
      {
        omni::PhaseScope p(tel, omni::phase::kCompute);
        torch::NoGradGuard no_grad;
        model->eval();
        std::tie(logits, targets) = model->NextTokenLogits(eval_tensors.images, eval_tensors.text);
        model->train();
      }
      const EvalResult r = ScoreEval(logits, targets, eval_batch, data, flags.seed);
      if (!flags.quiet) {
        std::printf("eval  step=%" PRId64
                    " token_acc=%.3f clean_acc=%.3f [%.3f, %.3f] ppl=%.3f ece=%.3f"
                    " temp=%.2f ppl@temp=%.3f\n",
                    step, r.token_accuracy, r.clean_accuracy, r.ci_low, r.ci_high, r.perplexity,
                    r.ece, r.temperature, r.calibrated_perplexity);
      }
    }

    {
      omni::PhaseScope p(tel, omni::phase::kHost);
      progress.last_loss = loss_value;
      if (step == 0) progress.first_loss = progress.last_loss;
      progress.step = completed = step + 1;
      if (loss_log != nullptr) {
        std::fprintf(loss_log, "step=%" PRId64 " loss=%.9g\n", step,
                     static_cast<double>(progress.last_loss));
        std::fflush(loss_log);
      }
      if (recovered) {
        std::fprintf(stderr,
                     "omni_train: elastic: committed step %" PRId64
                     " after recovery "
                     "t_mono_ns=%" PRId64 "\n",
                     step, omni::Clock::Real()->NowNanos());
        recovered = false;
      }
      if (!flags.quiet && (step % kProgressEvery == 0 || step + 1 == flags.steps)) {
        std::printf("train step=%" PRId64 " loss=%.4f\n", step,
                    static_cast<double>(progress.last_loss));
      }
    }

    const double step_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - step_t0).count();
    double& worst = is_eval(step) ? worst_eval_step_s : worst_step_s;
    worst = std::max(worst, step_s);

    // ---- step boundary: periodic checkpoint, then preemption
    bool saved_here = false;
    if (ckpt && flags.ckpt_every > 0 && completed % flags.ckpt_every == 0 &&
        completed < flags.steps) {
      omni::PhaseScope p(tel, omni::phase::kCheckpoint);
      if (auto st = save(flags.async_ckpt); !st.ok()) return Fail(st);
      saved_here = !flags.async_ckpt;
    }
    if (group) {
      absl::StatusOr<std::optional<omni::GroupChange>> change = group->AtBoundary(completed);
      if (!change.ok()) return Fail(change.status());
      if (change->has_value() && (*change)->generation.rank < 0 && leaving) {
        left_group = true;  // the others go on in this generation, without us
        std::fprintf(stderr, "omni_train: elastic: left the group: %s t_mono_ns=%" PRId64 "\n",
                     (*change)->generation.ToString().c_str(), omni::Clock::Real()->NowNanos());
      } else if (change->has_value()) {
        LogChange(**change, "changed");
        completed = progress.step;
      }
    }
    omni::BoundaryDecision d;
    if (monitor.pending()) {
      auto [step_cost, save_cost] = costs(step + 1);
      if (group) {
        // The agreed stop comes one boundary after the first local decision:
        // look two steps ahead.
        const omni::Cost second = costs(step + 2).first;
        step_cost.mean_s += second.mean_s;
        step_cost.stddev_s += second.stddev_s;
      }
      d = monitor.AtBoundary(step_cost, save_cost);
    }
    // --leave-on-preempt: this replica leaves alone, after one more step,
    // while the others go on. When the others would be too few
    // (min_replicas) the whole job stops at one boundary instead; while
    // another change is pending, it asks again at the next boundary; when not
    // even a save fits any more, it exits alone (the others see a failure).
    bool job_wide = group != nullptr && !flags.leave_on_preempt;
    if (group && flags.leave_on_preempt && !leaving && !leave_refused &&
        d.action == omni::BoundaryAction::kSaveAndExit) {
      const absl::Status asked = group->Leave(completed);
      if (asked.ok()) {
        leaving = true;
        std::fprintf(stderr, "omni_train: elastic: leaving the group after step %" PRId64 " (%s)\n",
                     step + 1, d.reason.c_str());
      } else {
        std::fprintf(stderr, "omni_train: elastic: %s\n", asked.ToString().c_str());
        leave_refused = !absl::IsUnavailable(asked);
      }
      if (!leave_refused) d = omni::BoundaryDecision{};
    }
    if (leave_refused) job_wide = true;
    if (left_group) {
      d.action = omni::BoundaryAction::kSaveAndExit;
      d.reason = "left the elastic group gracefully";
    } else if (leaving) {
      // On the way out: only a save that would no longer fit stops us now.
      if (d.action != omni::BoundaryAction::kExitWithoutSave) d = omni::BoundaryDecision{};
    } else if (job_wide) {
      // Every replica stops at one boundary, whichever of them was told to
      // stop (a signal to one replica, or a notice key that all of them read).
      const omni::Generation gen = group->generation();
      if (!stop || stop_generation != gen.number) {
        stop_store = omni::MakePrefixStore(*store, StopPrefix(gen));
        stop = std::make_unique<omni::StopCoordinator>(*stop_store);
        stop_generation = gen.number;
      }
      absl::StatusOr<omni::BoundaryDecision> agreed = stop->AtBoundary(step, d);
      if (!agreed.ok()) return Fail(agreed.status());
      d = *std::move(agreed);
    }
    if (d.action == omni::BoundaryAction::kContinue) continue;
    std::fprintf(stderr, "omni_train: preempted after step %" PRId64 ": %s\n", step,
                 d.reason.c_str());
    exit_code = omni::kExitPreemptedNoSave;
    if (d.action == omni::BoundaryAction::kSaveAndExit && ckpt) {
      if (!saved_here) {
        omni::PhaseScope p(tel, omni::phase::kCheckpoint);
        if (auto st = save(/*background=*/false); !st.ok()) return Fail(st);
      }
      if (auto st = ckpt->WaitForPending(); !st.ok()) return Fail(st);
      std::fprintf(stderr,
                   "omni_train: saved step %" PRId64 " to %s in %.1f ms; exiting %d (resumable)\n",
                   completed, flags.ckpt_dir.c_str(), 1e3 * last_save_s, omni::kExitPreempted);
      exit_code = omni::kExitPreempted;
    } else if (d.action == omni::BoundaryAction::kSaveAndExit) {
      std::fprintf(stderr, "omni_train: no --ckpt-dir: exiting %d without a checkpoint\n",
                   exit_code);
    } else {
      std::fprintf(stderr,
                   "omni_train: a checkpoint cannot finish before the deadline; exiting %d "
                   "without saving (the previous checkpoint stays valid)\n",
                   exit_code);
    }
  }
  if (exit_code >= 0) {
    // Release everything (loader thread, telemetry files, checkpoint writer)
    // and leave: the devices are free once the process is gone.
    close_loss_log();
    tel.Close().IgnoreError();
    std::fflush(stdout);
    return exit_code;
  }
  if (ckpt) {
    if (auto st = ckpt->WaitForPending(); !st.ok()) return Fail(st);
  }
  if (group) {
    // Replicas still waiting to be admitted learn that there is nothing left.
    if (auto st = group->membership().Finish(); !st.ok()) return Fail(st);
  }
  close_loss_log();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // ---- report
  const absl::Status closed = tel.Close();
  if (!flags.quiet) {
    std::printf("\ntrained %" PRId64 " steps in %.2f s (%.2f ms/step), loss %.4f -> %.4f\n",
                completed - start_step, seconds,
                1e3 * seconds / static_cast<double>(std::max<int64_t>(completed - start_step, 1)),
                static_cast<double>(progress.first_loss), static_cast<double>(progress.last_loss));
    if (!flags.text_only && loader) {
      std::printf("decode passes: %" PRId64 " total, %" PRId64 " max per sample (stall scale %g)\n",
                  loader->total_decode_passes(), loader->max_sample_decode_passes(),
                  flags.stall_scale);
    }
    std::printf("\n%s\n", tel.Snapshot().ToTable().c_str());
    absl::StatusOr<omni::Forecast> forecast = tel.LatestForecast();
    if (forecast.ok()) {
      std::printf("%s\n", omni::ForecastToTable(*forecast).c_str());
    } else {
      std::printf("no forecast: %s\n", forecast.status().ToString().c_str());
    }
    const omni::TelemetryCounters counters = tel.Counters();
    if (counters.misuse_errors > 0 || counters.steps_dropped > 0 || counters.steps_rejected > 0 ||
        counters.export_errors > 0) {
      std::printf("telemetry: %" PRId64 " misuse errors, %" PRId64 " steps dropped, %" PRId64
                  " rejected, %" PRId64 " export errors (last: %s)\n",
                  counters.misuse_errors, counters.steps_dropped, counters.steps_rejected,
                  counters.export_errors, counters.last_error.ToString().c_str());
    }
    if (!flags.log_path.empty()) std::printf("step log: %s\n", flags.log_path.c_str());
    if (!flags.trace_path.empty()) std::printf("trace:    %s\n", flags.trace_path.c_str());
    if (!flags.forecast_path.empty()) std::printf("forecast: %s\n", flags.forecast_path.c_str());
  }

  if (!flags.params_out.empty()) {
    if (auto st = WriteParams(model, flags.params_out); !st.ok()) return Fail(st);
  }
  const absl::StatusOr<uint64_t> digest = omni::torch_ext::ParamsXxh3(*model);
  if (!digest.ok()) return Fail(digest.status());
  std::printf("final step=%" PRId64 " params_xxh3=%s loss=%.6f\n", completed,
              omni::HexDigest(*digest).c_str(), static_cast<double>(progress.last_loss));
  std::fflush(stdout);
  if (!closed.ok()) return Fail(closed);
  return 0;
}

}  // namespace
}  // namespace omni_train

int main(int argc, char** argv) {
  // cuBLAS is deterministic only with a fixed workspace, chosen before CUDA
  // starts (a user's own setting stays).
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  absl::StatusOr<omni_train::TrainFlags> flags = omni_train::ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "omni_train: %s\nRun 'omni_train --help' for usage.\n",
                 std::string(flags.status().message()).c_str());
    return 2;
  }
  if (flags->help) {
    std::fputs(omni_train::Usage().c_str(), stdout);
    return 0;
  }
  try {
    return omni_train::Run(*flags);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "omni_train: LibTorch error: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "omni_train: error: %s\n", e.what());
  }
  return 1;
}
