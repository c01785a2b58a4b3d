// LibTorch adapters to omni::Stateful: module parameters and buffers,
// optimizer state (SGD, Adam, AdamW), an LR schedule, and every RNG (the
// torch CPU generator, each CUDA device's generator, user std engines).
// Register them in an omni::StateRegistry under "model", "optim", "lr",
// "rng" and a checkpoint carries the full training state.
//
// Thread safety: adapters read and write the objects they wrap; do not use
// those objects concurrently with Save / Load.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <random>
#include <string>

#include "omni/state.h"
#include "omni/torch/export.h"

namespace omni::torch_ext {

// The omni dtype of a torch scalar type; InvalidArgument for types a
// checkpoint cannot hold (complex, quantized).
OMNI_TORCH_EXPORT absl::StatusOr<omni::DType> ToDType(c10::ScalarType type);

// Parameters ("param/<name>") and buffers ("buffer/<name>") of a module, in
// named_parameters() / named_buffers() order. Load copies into the existing
// tensors (no reallocation; CUDA tensors through one host staging copy) and
// refuses a missing key or another dtype / shape, naming the key.
class OMNI_TORCH_EXPORT ModuleState final : public omni::Stateful {
 public:
  explicit ModuleState(torch::nn::Module& module) : module_(module) {}
  absl::Status Save(omni::StateWriter& writer) const override;
  absl::Status Load(const omni::StateReader& reader) override;

 private:
  torch::nn::Module& module_;
};

// Optimizer state of SGD, Adam or AdamW: per parameter group its learning
// rate ("group/<g>/lr"); per parameter (numbered in param_groups order) its
// step count and moments ("param/<i>/step", "param/<i>/exp_avg",
// "param/<i>/exp_avg_sq", "param/<i>/max_exp_avg_sq" with amsgrad;
// "param/<i>/momentum_buffer" for SGD). Other optimizers: Unimplemented.
class OMNI_TORCH_EXPORT OptimizerState final : public omni::Stateful {
 public:
  explicit OptimizerState(torch::optim::Optimizer& optimizer) : optimizer_(optimizer) {}
  absl::Status Save(omni::StateWriter& writer) const override;
  absl::Status Load(const omni::StateReader& reader) override;

 private:
  torch::optim::Optimizer& optimizer_;
};

// Linear warm-up then cosine decay to min_factor of the base rate, applied to
// every group of an optimizer; its state is the number of steps taken.
class OMNI_TORCH_EXPORT WarmupCosineSchedule final : public omni::Stateful {
 public:
  WarmupCosineSchedule(torch::optim::Optimizer& optimizer, double base_lr, int64_t warmup_steps,
                       int64_t total_steps, double min_factor = 0.1);
  // Sets the learning rate for the next optimizer step and counts it.
  void Step();
  double LrAt(int64_t step) const;
  int64_t steps_taken() const { return steps_; }
  absl::Status Save(omni::StateWriter& writer) const override;
  absl::Status Load(const omni::StateReader& reader) override;

 private:
  torch::optim::Optimizer& optimizer_;
  double base_lr_;
  int64_t warmup_, total_;
  double min_factor_;
  int64_t steps_ = 0;
};

// Every random number generator of this rank: the torch CPU generator
// ("torch_cpu"), the generator of each CUDA device when LibTorch has CUDA
// ("cuda/<i>"), and std engines registered by name ("engine/<name>"). Saved
// per rank, never deduplicated.
class OMNI_TORCH_EXPORT RngState final : public omni::Stateful {
 public:
  RngState();
  // The engine must outlive this object.
  void AddEngine(std::string name, std::mt19937_64* engine);
  absl::Status Save(omni::StateWriter& writer) const override;
  absl::Status Load(const omni::StateReader& reader) override;

 private:
  std::map<std::string, std::mt19937_64*> engines_;
};

}  // namespace omni::torch_ext
