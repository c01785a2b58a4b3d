// The training state of a LibTorch trainer in one place: modules,
// optimizers, LR schedules and every RNG, registered with an omni::Runtime
// in one call.
//
//   omni::torch_ext::TrainState state;
//   state.AddModule("gen", *generator).AddModule("disc", *discriminator)
//        .AddOptimizer("gen_optim", gen_opt).AddOptimizer("disc_optim", disc_opt);
//   auto loader = omni::torch_ext::MakeDataLoader(state, std::move(dataset), options);
//   state.RegisterWith(*rt);    // + "rng" (torch CPU, CUDA, added engines) per replica
//
// Modules, optimizers and schedules are replicated state (identical on every
// replica; the elastic group synchronises them); the RNGs and data loader
// positions are per replica.
//
// Thread safety: not thread-safe; the objects must outlive the Runtime's use
// of them (its Start, EndStep and saves).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "omni/hash.h"
#include "omni/runtime.h"
#include "omni/state.h"
#include "omni/torch/check.h"
#include "omni/torch/data_loader.h"
#include "omni/torch/export.h"
#include "omni/torch/state.h"

namespace omni::torch_ext {

class OMNI_TORCH_EXPORT TrainState {
 public:
  TrainState() = default;
  TrainState(const TrainState&) = delete;
  TrainState& operator=(const TrainState&) = delete;

  // Parameters and buffers of `module` under `name` (ModuleState).
  TrainState& AddModule(std::string name, torch::nn::Module& module);
  // SGD, Adam or AdamW state under `name` (OptimizerState).
  TrainState& AddOptimizer(std::string name, torch::optim::Optimizer& optimizer);
  // Any other replicated state (an LR schedule such as WarmupCosineSchedule,
  // counters): not owned.
  TrainState& Add(std::string name, omni::Stateful* object);
  // A std engine of this replica, saved with the RNGs (not owned).
  TrainState& AddEngine(std::string name, std::mt19937_64* engine);
  // The position of a torch::data loader whose sampler is a ResumableSampler
  // over it (MakeDataLoader makes both): per-replica state that counts one
  // batch consumed at each commit (Runtime::OnCommit), so the loop needs one
  // step per batch.
  TrainState& AddLoader(std::string name, std::shared_ptr<LoaderPosition> position);

  // Registers everything with `rt` (before rt.Start()), the RNGs as "rng"
  // (per replica). Errors as Runtime::Register, naming the object.
  absl::Status RegisterWith(Runtime& rt);

  // XXH3-64 over the replicated state (names, keys, dtypes, shapes and
  // bytes of modules, optimizers and the added objects, in the order they
  // were added): two runs that end with bit-identical training state print
  // the same digest. Errors of the objects' Save.
  absl::StatusOr<uint64_t> Xxh3() const;

 private:
  std::vector<std::pair<std::string, std::unique_ptr<omni::Stateful>>> owned_;
  std::vector<std::pair<std::string, omni::Stateful*>> replicated_;
  std::vector<std::pair<std::string, std::shared_ptr<LoaderPosition>>> loaders_;
  RngState rng_;
};

// torch::data::make_data_loader(dataset, options) made resumable: the same
// RandomSampler over the whole dataset (LibTorch's default), wrapped in a
// ResumableSampler whose position `state` registers as `name`. Throws
// c10::Error, like make_data_loader, for a dataset without a size.
template <typename Dataset>
auto MakeDataLoader(TrainState& state, Dataset dataset,
                    torch::data::DataLoaderOptions options = torch::data::DataLoaderOptions(),
                    std::string name = "loader") {
  const torch::optional<size_t> size = dataset.size();
  TORCH_CHECK(size.has_value(),
              "omni::torch_ext::MakeDataLoader: the dataset has no size (a RandomSampler needs "
              "one)");
  auto position = std::make_shared<LoaderPosition>();
  state.AddLoader(std::move(name), position);
  using Sampler = torch::data::samplers::RandomSampler;
  return torch::data::make_data_loader(
      std::move(dataset),
      ResumableSampler<Sampler>(Sampler(static_cast<int64_t>(*size)), std::move(position)),
      options);
}

// A digest of the parameters' names, dtypes and shapes (not their values):
// set it as RuntimeOptions::elastic.membership.model_digest so that replicas
// of another model are refused.
OMNI_TORCH_EXPORT std::string ModelDigest(const torch::nn::Module& module);

}  // namespace omni::torch_ext
