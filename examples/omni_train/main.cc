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
//            checkpoint (every --ckpt-every steps or --ckpt-every-s seconds, and when
//            preempted)
//
// With --ckpt-dir the full state (parameters, AdamW moments, LR schedule,
// every RNG, the data sampler's cursor, the step) is checkpointed, and a run
// started again with the same flags resumes bit-exactly from the newest valid
// checkpoint. A PreemptionMonitor turns SIGTERM / SIGUSR1 / SIGINT and
// scheduler notices into a save at the last boundary before the deadline.
//
// With --store the process is one replica of an elastic data-parallel job
// (omni::ElasticGroup): it takes its share of each global batch, gradients
// are summed over the replicas (phase "comm": Gloo on the CPU, NCCL on the
// GPU with --device cuda), and replicas may die, freeze or join at step
// boundaries; a step whose allreduce fails is not committed, the survivors
// agree on a new generation and the step is redone.
//
// Everything Omni does here goes through one omni::Runtime (see
// include/omni/runtime.h): the trainer registers its state, wraps each step
// in BeginStep / EndStep and does what EndStep decides. The eval scoring
// (eval.h) is demo-only.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "data.h"
#include "eval.h"
#include "flags.h"
#include "model.h"
#include "omni/forecast.h"
#include "omni/hash.h"
#include "omni/phase.h"
#include "omni/runtime.h"
#include "omni/state.h"
#include "omni/telemetry.h"
#include "omni/torch/grad_sync.h"
#include "omni/torch/params.h"
#include "omni/torch/state.h"
#include "omni/torch/store.h"
#include "omni/torch/train_state.h"

namespace omni_train {
namespace {

constexpr int kPrefetchBatches = 2;
constexpr int kEvalSamples = 256;  // held-out set: eval steps are long, as in real jobs
constexpr int kProgressEvery = 50;
constexpr int64_t kWarmupSteps = 20;

// Identifies the training configuration in checkpoints, so that a run never
// resumes from another configuration's state.
std::string JobId(const TrainFlags& f) {
  return absl::StrCat("omni_train seed=", f.seed, " batch=", f.batch, " lr=", f.lr,
                      " steps=", f.steps, f.text_only ? " text-only" : "",
                      f.float64 ? " float64" : "",
                      f.dropout > 0 ? absl::StrCat(" dropout=", f.dropout) : "");
}

struct BatchTensors {
  torch::Tensor images;  // undefined when text-only
  torch::Tensor text;
};

BatchTensors ToTensors(Batch& b, const torch::Device& device, torch::Dtype dtype) {
  BatchTensors t;
  if (!b.images.empty()) {
    t.images = torch::from_blob(b.images.data(), {b.size, kChannels, kImageSize, kImageSize},
                                torch::kFloat)
                   .to(device, dtype, /*non_blocking=*/false, /*copy=*/true);
  }
  t.text = torch::from_blob(b.text.data(), {b.size, kTextLen}, torch::kLong)
               .to(device, /*non_blocking=*/false, /*copy=*/true);
  return t;
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

// The training device: "cuda" is the GPU of this process's LOCAL_RANK (one
// process per GPU under torchrun or Slurm), "cuda:N" GPU N. On CUDA only
// deterministic kernels run (and cuBLAS gets a fixed workspace, set in
// main() before CUDA starts), so that a run and its preempted-and-resumed
// twin stay bit-identical.
absl::StatusOr<torch::Device> TrainingDevice(const std::string& name, int local_rank) {
  const torch::Device device(name);
  if (!device.is_cuda()) return device;
  const int64_t visible = static_cast<int64_t>(torch::cuda::device_count());
  if (visible == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device ", name, ": no CUDA device is visible to this LibTorch"));
  }
  const int64_t index = device.has_index() ? device.index() : local_rank % visible;
  if (index >= visible) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device ", name, ": ", visible, " CUDA device(s) visible to this LibTorch"));
  }
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  at::globalContext().setDeterministicCuDNN(true);
  at::globalContext().setBenchmarkCuDNN(false);
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

// The Runtime's options: the environment's (torchrun, Slurm, OMNI_*), then
// the flags, which win. On CUDA the replicas reduce over NCCL on the training
// device (no Gloo needed); on the CPU over Gloo.
omni::RuntimeOptions Options(const TrainFlags& flags, MultimodalLm& model, omni::RuntimeOptions o,
                             const torch::Device& device) {
  o.source = "omni_train";
  o.job_id = JobId(flags);
  o.total_steps = flags.steps;
  o.telemetry.stats.window = flags.window;
  if (!flags.log_path.empty()) o.telemetry.step_log_path = flags.log_path;
  if (!flags.trace_path.empty()) o.telemetry.trace_path = flags.trace_path;
  o.telemetry.window_channel_name = flags.window_channel;
  o.publish_prefix = flags.publish_prefix;
  o.forecast_path = flags.forecast_path;
  if (flags.eval_every > 0) {
    o.telemetry.forecast.eval.every_steps = flags.eval_every;
    o.telemetry.forecast.eval.offset = flags.eval_every - 1;
  }
  if (!flags.ckpt_dir.empty()) o.ckpt_dir = flags.ckpt_dir;
  if (flags.ckpt_every > 0) o.ckpt_every = flags.ckpt_every;
  if (flags.ckpt_every_s > 0) o.ckpt_every_time = absl::Seconds(flags.ckpt_every_s);
  o.keep_last = flags.keep;
  o.async_ckpt = flags.async_ckpt;
  o.start_fresh = flags.start_fresh;
  if (!flags.notice_file.empty()) o.preemption.notice_file = flags.notice_file;
  if (!flags.notice_key.empty()) o.notice_key = flags.notice_key;
  if (!flags.store.empty()) o.store_uri = flags.store;
  omni::MembershipOptions& m = o.elastic.membership;
  if (!flags.replica_id.empty()) m.self.id = flags.replica_id;
  m.model_digest = omni::torch_ext::ModelDigest(*model);
  m.min_replicas = flags.min_replicas;
  m.max_replicas = flags.max_replicas;
  m.heartbeat = absl::Milliseconds(flags.heartbeat_ms);
  m.peer_timeout = absl::Milliseconds(flags.peer_timeout_ms);
  o.leave_on_preempt = flags.leave_on_preempt;
  o.sampler.dataset_size = kDatasetSize;
  o.sampler.global_batch = flags.batch;
  o.sampler.seed = flags.seed;
  if (device.is_cuda()) {
    o.elastic.backend = "nccl";
    // TrainingDevice always sets the index (a signed char, never negative).
    o.elastic.device = static_cast<uint8_t>(device.index());
  }
  return o;
}

void PrintReport(const TrainFlags& flags, omni::Telemetry& tel, const DataLoader* loader,
                 int64_t steps, double seconds, float first_loss, float last_loss) {
  std::printf("\ntrained %" PRId64 " steps in %.2f s (%.2f ms/step), loss %.4f -> %.4f\n", steps,
              seconds, 1e3 * seconds / static_cast<double>(std::max<int64_t>(steps, 1)),
              static_cast<double>(first_loss), static_cast<double>(last_loss));
  if (!flags.text_only && loader != nullptr) {
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

int Run(const TrainFlags& flags) {
  torch::set_num_threads(flags.threads);
  torch::manual_seed(flags.seed);
  // The environment first: LOCAL_RANK picks the GPU of "--device cuda".
  absl::StatusOr<omni::RuntimeOptions> env = omni::RuntimeOptions::FromEnvironment();
  if (!env.ok()) return Fail(env.status());
  const absl::StatusOr<torch::Device> device_or = TrainingDevice(flags.device, env->local_rank);
  if (!device_or.ok()) return Fail(device_or.status());
  const torch::Device device = *device_or;

  // ---- model, optimizer, LR schedule (initialised on the CPU: the same on
  // every device)
  ModelConfig model_config;
  model_config.vocab = kVocab;
  model_config.text_len = kTextLen;
  model_config.dropout = flags.dropout;
  MultimodalLm model(model_config);
  const torch::Dtype dtype = flags.float64 ? torch::kDouble : torch::kFloat;
  model->to(device, dtype);
  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(flags.lr).weight_decay(0.01));
  omni::torch_ext::WarmupCosineSchedule schedule(optimizer, flags.lr, kWarmupSteps, flags.steps);

  // ---- the runtime: telemetry, preemption, checkpoints, elastic group, sampler
  if (auto st = omni::torch_ext::RegisterTcpStore(); !st.ok()) return Fail(st);
  absl::StatusOr<std::unique_ptr<omni::Runtime>> created =
      omni::Runtime::Create(Options(flags, model, *std::move(env), device));
  if (!created.ok()) return Fail(created.status());
  omni::Runtime& rt = **created;
  omni::Telemetry& tel = rt.telemetry();

  struct Progress {
    float last_loss = 0;
    float first_loss = 0;
  } progress;
  omni::BytesState progress_state("losses", &progress, sizeof(progress));
  omni::torch_ext::TrainState state;
  state.AddModule("model", *model)
      .AddOptimizer("optim", optimizer)
      .Add("lr", &schedule)
      .Add("train", &progress_state);
  if (auto st = state.RegisterWith(rt); !st.ok()) return Fail(st);
  absl::StatusOr<int64_t> started = rt.Start();
  if (!started.ok()) return Fail(started.status());
  const int64_t start_step = *started;
  const bool elastic = rt.group() != nullptr;

  DataConfig data;
  data.seed = flags.seed;
  data.batch = flags.batch;
  data.text_only = flags.text_only;
  data.stall_scale = flags.stall_scale;
  data.stall_io = flags.stall_io;
  data.shard_batches = flags.shard_batches;
  data.shard_fetch_ms = flags.shard_fetch_ms;
  DataConfig eval_data = data;
  eval_data.batch = kEvalSamples;
  Batch eval_batch = MakeBatch(eval_data, kEvalStream, 0, /*decode=*/false);
  const BatchTensors eval_tensors = ToTensors(eval_batch, device, dtype);

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

  // Micro-batch of a replica: a full group takes its share in one.
  const int64_t micro_batch = (flags.batch + flags.max_replicas - 1) / flags.max_replicas;
  // A single process prefetches on a thread; a replica reads its share of
  // each global batch at the committed cursor (it changes with the group).
  std::unique_ptr<DataLoader> loader;
  if (!elastic) {
    loader = std::make_unique<DataLoader>(data, *rt.sampler(), rt.sampler()->cursor(),
                                          flags.steps - start_step, kPrefetchBatches);
  }

  // ---- training loop
  const auto t0 = std::chrono::steady_clock::now();
  int exit_code = -1;  // set when preempted
  for (int64_t step = start_step; step < flags.steps; step = rt.step()) {
    if (auto st = rt.BeginStep(); !st.ok()) return Fail(st);
    BatchTensors batch;
    {
      omni::PhaseScope p(tel, omni::phase::kDataWait);
      if (elastic) {
        absl::StatusOr<std::vector<int64_t>> indices = rt.LocalBatch();
        if (!indices.ok()) return Fail(indices.status());
        FetchShardOf(data, step);
        Batch b = MakeBatchOf(data, kTrainStream, step, *indices, /*decode=*/true);
        batch = ToTensors(b, device, dtype);
      } else {
        FetchShardOf(data, step);
        absl::StatusOr<Batch> next = loader->Next();
        if (!next.ok()) return Fail(next.status());
        batch = ToTensors(*next, device, dtype);
      }
    }

    float loss_value = 0;
    {
      omni::PhaseScope p(tel, omni::phase::kCompute);
      optimizer.zero_grad();
      if (elastic) {
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

    absl::Status reduced;
    if (elastic) {
      omni::PhaseScope p(tel, omni::phase::kComm);
      reduced = omni::torch_ext::AllReduceGradients(rt, model->parameters());
      if (reduced.ok())
        reduced = rt.AllReduce(&loss_value, 1, omni::DType::kF32, omni::ReduceOp::kSum);
    }
    if (reduced.ok()) {
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
          std::tie(logits, targets) =
              model->NextTokenLogits(eval_tensors.images, eval_tensors.text);
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
      omni::PhaseScope p(tel, omni::phase::kHost);
      progress.last_loss = loss_value;
      if (step == 0) progress.first_loss = progress.last_loss;
      if (loss_log != nullptr) {
        std::fprintf(loss_log, "step=%" PRId64 " loss=%.9g\n", step,
                     static_cast<double>(progress.last_loss));
        std::fflush(loss_log);
      }
      if (!flags.quiet && (step % kProgressEvery == 0 || step + 1 == flags.steps)) {
        std::printf("train step=%" PRId64 " loss=%.4f\n", step,
                    static_cast<double>(progress.last_loss));
      }
    }

    // ---- step boundary: commit, checkpoint, group changes, preemption
    absl::StatusOr<omni::Decision> d = rt.EndStep();
    if (!d.ok()) return Fail(d.status());
    if (d->kind == omni::Decision::kSaveAndExit) {
      exit_code = d->exit_code;
      break;
    }
  }
  if (exit_code >= 0) {
    // Release everything (loader thread, telemetry files, checkpoint writer)
    // and leave: the devices are free once the process is gone.
    close_loss_log();
    rt.Finish().IgnoreError();
    std::fflush(stdout);
    return exit_code;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  close_loss_log();
  const absl::Status finished = rt.Finish();
  if (!flags.quiet) {
    PrintReport(flags, tel, loader.get(), rt.step() - start_step, seconds, progress.first_loss,
                progress.last_loss);
  }
  if (!flags.params_out.empty()) {
    if (auto st = WriteParams(model, flags.params_out); !st.ok()) return Fail(st);
  }
  const absl::StatusOr<uint64_t> digest = omni::torch_ext::ParamsXxh3(*model);
  if (!digest.ok()) return Fail(digest.status());
  std::printf("final step=%" PRId64 " params_xxh3=%s loss=%.6f\n", rt.step(),
              omni::HexDigest(*digest).c_str(), static_cast<double>(progress.last_loss));
  std::fflush(stdout);
  if (!finished.ok()) return Fail(finished);
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
    const int code = omni_train::Run(*flags);
    // Everything that writes a file (the Runtime, its checkpoints and logs,
    // the parameters) was closed in Run's scope. LibTorch's static
    // destructors (its dispatcher deregisters every operator) would take
    // ~0.1 s more before the process is gone: after a preemption's save that
    // is time past the deadline no decision budgets for.
    std::fflush(nullptr);
    std::_Exit(code);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "omni_train: LibTorch error: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "omni_train: error: %s\n", e.what());
  }
  return 1;
}
