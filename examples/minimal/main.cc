// minimal: a LibTorch training loop with telemetry, bit-exact checkpoints,
// graceful preemption and elastic data parallelism, all through omni::Runtime.
// Configured by the environment (torchrun, Slurm or OMNI_* variables):
//   OMNI_CKPT_DIR=/ckpt OMNI_CKPT_EVERY=100 OMNI_STEP_LOG=steps.jsonl minimal 5000
//   OMNI_STORE=file:///shared/store OMNI_REPLICA_ID=r0 minimal   # one replica of many;
//                                         # all replicas share one OMNI_CKPT_DIR
// SIGTERM saves at a step boundary and exits 75 (resumable: run it again).
#include <torch/torch.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "omni/hash.h"
#include "omni/runtime.h"
#include "omni/torch/grad_sync.h"
#include "omni/torch/params.h"
#include "omni/torch/store.h"
#include "omni/torch/train_state.h"

namespace {

constexpr int64_t kSamples = 4096, kFeatures = 16, kBatch = 64;

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "minimal: %s\n", st.ToString().c_str());
  return 1;
}

int Train(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::strtoll(argv[1], nullptr, 10) : 2000;
  torch::set_num_threads(1);
  torch::manual_seed(0);  // the same data and initial model in every process
  const torch::Tensor x = torch::randn({kSamples, kFeatures});
  const torch::Tensor y = torch::sin(x.sum(1, /*keepdim=*/true));
  torch::nn::Sequential net(torch::nn::Linear(kFeatures, 64), torch::nn::ReLU(),
                            torch::nn::Linear(64, 1));
  torch::optim::Adam optimizer(net->parameters(), torch::optim::AdamOptions(1e-3));

  // ---- the runtime: options from the launcher's environment, then ours
  if (auto st = omni::torch_ext::RegisterTcpStore(); !st.ok()) return Fail(st);
  absl::StatusOr<omni::RuntimeOptions> options = omni::RuntimeOptions::FromEnvironment();
  if (!options.ok()) return Fail(options.status());
  options->source = "minimal";
  options->job_id = "minimal";
  options->total_steps = steps;
  options->sampler.dataset_size = kSamples;
  options->sampler.global_batch = kBatch;
  options->elastic.membership.model_digest = omni::torch_ext::ModelDigest(*net);
  absl::StatusOr<std::unique_ptr<omni::Runtime>> created = omni::Runtime::Create(*options);
  if (!created.ok()) return Fail(created.status());
  omni::Runtime& rt = **created;
  omni::Telemetry& tel = rt.telemetry();

  // ---- the training state, registered once
  float loss_value = 0;
  omni::BytesState loss_state("value", &loss_value, sizeof(loss_value));
  omni::torch_ext::TrainState state;
  state.AddModule("model", *net).AddOptimizer("optim", optimizer).Add("loss", &loss_state);
  if (auto st = state.RegisterWith(rt); !st.ok()) return Fail(st);
  absl::StatusOr<int64_t> start = rt.Start();  // restores, joins the group
  if (!start.ok()) return Fail(start.status());

  for (int64_t step = *start; step < steps; step = rt.step()) {
    if (auto st = rt.BeginStep(); !st.ok()) return Fail(st);
    torch::Tensor bx, by;
    {
      omni::PhaseScope p(tel, omni::phase::kDataWait);
      absl::StatusOr<std::vector<int64_t>> indices = rt.LocalBatch();  // this replica's share
      if (!indices.ok()) return Fail(indices.status());
      const torch::Tensor index = torch::tensor(*indices, torch::kLong);
      bx = x.index_select(0, index);
      by = y.index_select(0, index);
    }
    float local = 0;
    {
      omni::PhaseScope p(tel, omni::phase::kCompute);
      optimizer.zero_grad();
      // Mean over the global batch: each replica weighs its share.
      torch::Tensor loss = torch::mse_loss(net->forward(bx), by) *
                           (static_cast<double>(bx.size(0)) / static_cast<double>(kBatch));
      loss.backward();
      local = loss.item<float>();
    }
    absl::Status reduced;
    {
      omni::PhaseScope p(tel, omni::phase::kComm);
      reduced = omni::torch_ext::AllReduceGradients(rt, net->parameters());
      if (reduced.ok()) reduced = rt.AllReduce(&local, 1, omni::DType::kF32, omni::ReduceOp::kSum);
    }
    if (reduced.ok()) {  // otherwise the step is redone after the group recovers
      omni::PhaseScope p(tel, omni::phase::kOptimizer);
      optimizer.step();
      loss_value = local;
    }
    absl::StatusOr<omni::Decision> d = rt.EndStep();  // commit, checkpoint, resize, preempt
    if (!d.ok()) return Fail(d.status());
    if (d->kind == omni::Decision::kSaveAndExit) return d->exit_code;
  }
  if (auto st = rt.Finish(); !st.ok()) return Fail(st);
  const absl::StatusOr<uint64_t> digest = omni::torch_ext::ParamsXxh3(*net);
  if (!digest.ok()) return Fail(digest.status());
  std::printf("final step=%" PRId64 " params_xxh3=%s loss=%.6f\n", rt.step(),
              omni::HexDigest(*digest).c_str(), static_cast<double>(loss_value));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Train(argc, argv);
  } catch (const std::exception& e) {  // LibTorch reports errors as exceptions
    return Fail(absl::InternalError(e.what()));
  }
}
