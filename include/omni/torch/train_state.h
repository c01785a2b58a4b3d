// The training state of a LibTorch trainer in one place: modules,
// optimizers, LR schedules and every RNG, registered with an omni::Runtime
// in one call.
//
//   omni::torch_ext::TrainState state;
//   state.AddModule("gen", *generator).AddModule("disc", *discriminator)
//        .AddOptimizer("gen_optim", gen_opt).AddOptimizer("disc_optim", disc_opt);
//   state.RegisterWith(*rt);    // + "rng" (torch CPU, CUDA, added engines) per replica
//
// Modules, optimizers and schedules are replicated state (identical on every
// replica; the elastic group synchronises them); the RNGs are per replica.
//
// Thread safety: not thread-safe; the objects must outlive the Runtime's use
// of them (its Start, EndStep and saves).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "omni/runtime.h"
#include "omni/state.h"
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

  // Registers everything with `rt` (before rt.Start()), the RNGs as "rng"
  // (per replica). Errors as Runtime::Register, naming the object.
  absl::Status RegisterWith(Runtime& rt);

 private:
  std::vector<std::pair<std::string, std::unique_ptr<omni::Stateful>>> owned_;
  std::vector<std::pair<std::string, omni::Stateful*>> replicated_;
  RngState rng_;
};

// A digest of the parameters' names, dtypes and shapes (not their values):
// set it as RuntimeOptions::elastic.membership.model_digest so that replicas
// of another model are refused.
OMNI_TORCH_EXPORT std::string ModelDigest(const torch::nn::Module& module);

}  // namespace omni::torch_ext
