#include "omni/torch/train_state.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "omni/hash.h"

namespace omni::torch_ext {

TrainState& TrainState::AddModule(std::string name, torch::nn::Module& module) {
  auto s = std::make_unique<ModuleState>(module);
  replicated_.emplace_back(name, s.get());
  owned_.emplace_back(std::move(name), std::move(s));
  return *this;
}

TrainState& TrainState::AddOptimizer(std::string name, torch::optim::Optimizer& optimizer) {
  auto s = std::make_unique<OptimizerState>(optimizer);
  replicated_.emplace_back(name, s.get());
  owned_.emplace_back(std::move(name), std::move(s));
  return *this;
}

TrainState& TrainState::Add(std::string name, omni::Stateful* object) {
  replicated_.emplace_back(std::move(name), object);
  return *this;
}

TrainState& TrainState::AddEngine(std::string name, std::mt19937_64* engine) {
  rng_.AddEngine(std::move(name), engine);
  return *this;
}

absl::Status TrainState::RegisterWith(Runtime& rt) {
  for (const auto& [name, object] : replicated_) {
    if (auto st = rt.Register(name, object, StateScope::kReplicated); !st.ok()) return st;
  }
  return rt.Register("rng", &rng_, StateScope::kPerReplica);
}

std::string ModelDigest(const torch::nn::Module& module) {
  omni::Xxh3 h;
  for (const auto& item : module.named_parameters()) {
    const std::string line =
        absl::StrCat(item.key(), " ", c10::toString(item.value().scalar_type()), " ",
                     c10::str(item.value().sizes()), "\n");
    h.Update(line.data(), line.size());
  }
  return omni::HexDigest(h.Digest());
}

}  // namespace omni::torch_ext
