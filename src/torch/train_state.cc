#include "omni/torch/train_state.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

TrainState& TrainState::AddLoader(std::string name, std::shared_ptr<LoaderPosition> position) {
  loaders_.emplace_back(std::move(name), std::move(position));
  return *this;
}

absl::Status TrainState::RegisterWith(Runtime& rt) {
  for (const auto& [name, object] : replicated_) {
    if (auto st = rt.Register(name, object, StateScope::kReplicated); !st.ok()) return st;
  }
  for (const auto& [name, position] : loaders_) {
    if (auto st = rt.Register(name, position.get(), StateScope::kPerReplica); !st.ok()) return st;
    LoaderPosition* p = position.get();
    if (auto st = rt.OnCommit([p] { p->Consumed(); }); !st.ok()) return st;
  }
  return rt.Register("rng", &rng_, StateScope::kPerReplica);
}

namespace {

// Hashes everything a Stateful saves, in order.
class HashingWriter final : public omni::StateWriter {
 public:
  explicit HashingWriter(omni::Xxh3& h) : h_(h) {}
  absl::Status PutTensor(std::string_view key, omni::DType dtype, std::vector<int64_t> shape,
                         const void* data, size_t nbytes) override {
    Text(absl::StrCat(std::string(key), " ", omni::DTypeName(dtype), " ", absl::StrJoin(shape, "x"),
                      "\n"));
    h_.Update(data, nbytes);
    return absl::OkStatus();
  }
  absl::Status PutBytes(std::string_view key, std::string_view bytes) override {
    Text(absl::StrCat(std::string(key), " bytes ", bytes.size(), "\n"));
    h_.Update(bytes.data(), bytes.size());
    return absl::OkStatus();
  }

 private:
  void Text(const std::string& s) { h_.Update(s.data(), s.size()); }
  omni::Xxh3& h_;
};

}  // namespace

absl::StatusOr<uint64_t> TrainState::Xxh3() const {
  omni::Xxh3 h;
  HashingWriter writer(h);
  for (const auto& [name, object] : replicated_) {
    const std::string header = absl::StrCat("[", name, "]\n");
    h.Update(header.data(), header.size());
    if (auto st = object->Save(writer); !st.ok()) return st;
  }
  return h.Digest();
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
