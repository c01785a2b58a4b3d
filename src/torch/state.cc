#include "omni/torch/state.h"

#include <torch/cuda.h>

#include <cmath>
#include <mutex>
#include <sstream>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"

namespace omni::torch_ext {
namespace {

std::vector<int64_t> Shape(const torch::Tensor& t) { return t.sizes().vec(); }

absl::Status SaveTensor(omni::StateWriter& w, const std::string& key, const torch::Tensor& t) {
  auto dtype = ToDType(t.scalar_type());
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": ", dtype.status().message()));
  }
  const torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
  return w.PutTensor(key, *dtype, Shape(c), c.data_ptr(), c.nbytes());
}

// Loads `key` into the existing tensor `t` (same dtype and shape).
absl::Status LoadTensor(const omni::StateReader& r, const std::string& key, torch::Tensor& t) {
  auto dtype = ToDType(t.scalar_type());
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": ", dtype.status().message()));
  }
  torch::NoGradGuard no_grad;
  if (t.device().is_cpu() && t.is_contiguous()) {
    return r.ReadTensor(key, *dtype, Shape(t), t.data_ptr(), t.nbytes());
  }
  torch::Tensor staging = torch::empty(t.sizes(), t.options().device(torch::kCPU));
  if (auto st = r.ReadTensor(key, *dtype, Shape(t), staging.data_ptr(), staging.nbytes());
      !st.ok()) {
    return st;
  }
  t.copy_(staging);
  return absl::OkStatus();
}

// A tensor whose shape and dtype come from the checkpoint (optimizer moments
// that do not exist yet in a fresh optimizer), placed like `like`.
absl::StatusOr<torch::Tensor> LoadNewTensor(const omni::StateReader& r, const std::string& key,
                                            const torch::Tensor& like) {
  auto info = r.Find(key);
  if (!info.ok()) return info.status();
  torch::Tensor t = torch::empty(info->shape, like.options().device(torch::kCPU));
  auto dtype = ToDType(t.scalar_type());
  if (!dtype.ok() || *dtype != info->dtype || t.nbytes() != info->nbytes) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": checkpoint has ",
                                                   omni::DTypeName(info->dtype),
                                                   ", the parameter needs another dtype"));
  }
  if (auto st = r.ReadTensor(key, info->dtype, info->shape, t.data_ptr(), t.nbytes()); !st.ok()) {
    return st;
  }
  return t.to(like.device());
}

absl::Status PutI64(omni::StateWriter& w, const std::string& key, int64_t v) {
  return w.PutTensor(key, omni::DType::kI64, {}, &v, sizeof(v));
}
absl::StatusOr<int64_t> GetI64(const omni::StateReader& r, const std::string& key) {
  int64_t v = 0;
  if (auto st = r.ReadTensor(key, omni::DType::kI64, {}, &v, sizeof(v)); !st.ok()) return st;
  return v;
}
absl::Status PutF64(omni::StateWriter& w, const std::string& key, double v) {
  return w.PutTensor(key, omni::DType::kF64, {}, &v, sizeof(v));
}
absl::StatusOr<double> GetF64(const omni::StateReader& r, const std::string& key) {
  double v = 0;
  if (auto st = r.ReadTensor(key, omni::DType::kF64, {}, &v, sizeof(v)); !st.ok()) return st;
  return v;
}

// The key the optimizer's state map uses for a parameter: a string of the
// TensorImpl address in LibTorch 1.x, the address itself in 2.x.
template <typename Map>
typename Map::key_type StateKey(const torch::Tensor& p) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;  // what 1.x's c10::guts::to_string did (gone in 2.x)
    os << p.unsafeGetTensorImpl();
    return os.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

std::vector<torch::Tensor> AllParams(torch::optim::Optimizer& opt) {
  std::vector<torch::Tensor> out;
  for (auto& g : opt.param_groups()) {
    for (auto& p : g.params()) out.push_back(p);
  }
  return out;
}

double GroupLr(torch::optim::OptimizerParamGroup& g) {
  auto& o = g.options();
  if (auto* a = dynamic_cast<torch::optim::AdamOptions*>(&o)) return a->lr();
  if (auto* a = dynamic_cast<torch::optim::AdamWOptions*>(&o)) return a->lr();
  if (auto* s = dynamic_cast<torch::optim::SGDOptions*>(&o)) return s->lr();
  return std::nan("");
}

void SetGroupLr(torch::optim::OptimizerParamGroup& g, double lr) {
  auto& o = g.options();
  if (auto* a = dynamic_cast<torch::optim::AdamOptions*>(&o)) a->lr(lr);
  if (auto* a = dynamic_cast<torch::optim::AdamWOptions*>(&o)) a->lr(lr);
  if (auto* s = dynamic_cast<torch::optim::SGDOptions*>(&o)) s->lr(lr);
}

enum class Kind { kAdam, kAdamW, kSgd, kOther };

Kind KindOf(torch::optim::Optimizer& opt) {
  if (dynamic_cast<torch::optim::Adam*>(&opt) != nullptr) return Kind::kAdam;
  if (dynamic_cast<torch::optim::AdamW*>(&opt) != nullptr) return Kind::kAdamW;
  if (dynamic_cast<torch::optim::SGD*>(&opt) != nullptr) return Kind::kSgd;
  return Kind::kOther;
}

template <typename ParamState>
absl::Status SaveMoments(omni::StateWriter& w, const std::string& p, const ParamState& s) {
  if (auto st = PutI64(w, p + "step", s.step()); !st.ok()) return st;
  if (auto st = SaveTensor(w, p + "exp_avg", s.exp_avg()); !st.ok()) return st;
  if (auto st = SaveTensor(w, p + "exp_avg_sq", s.exp_avg_sq()); !st.ok()) return st;
  if (s.max_exp_avg_sq().defined()) return SaveTensor(w, p + "max_exp_avg_sq", s.max_exp_avg_sq());
  return absl::OkStatus();
}

template <typename ParamState>
absl::StatusOr<std::unique_ptr<ParamState>> LoadMoments(const omni::StateReader& r,
                                                        const std::string& p,
                                                        const torch::Tensor& param) {
  auto step = GetI64(r, p + "step");
  if (!step.ok()) return step.status();
  auto avg = LoadNewTensor(r, p + "exp_avg", param);
  if (!avg.ok()) return avg.status();
  auto sq = LoadNewTensor(r, p + "exp_avg_sq", param);
  if (!sq.ok()) return sq.status();
  auto s = std::make_unique<ParamState>();
  s->step(*step);
  s->exp_avg(*avg);
  s->exp_avg_sq(*sq);
  if (r.Find(p + "max_exp_avg_sq").ok()) {
    auto mx = LoadNewTensor(r, p + "max_exp_avg_sq", param);
    if (!mx.ok()) return mx.status();
    s->max_exp_avg_sq(*mx);
  }
  return s;
}

}  // namespace

absl::StatusOr<omni::DType> ToDType(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Bool:
      return omni::DType::kBool;
    case c10::ScalarType::Byte:
      return omni::DType::kU8;
    case c10::ScalarType::Char:
      return omni::DType::kI8;
    case c10::ScalarType::Short:
      return omni::DType::kI16;
    case c10::ScalarType::Int:
      return omni::DType::kI32;
    case c10::ScalarType::Long:
      return omni::DType::kI64;
    case c10::ScalarType::Half:
      return omni::DType::kF16;
    case c10::ScalarType::BFloat16:
      return omni::DType::kBF16;
    case c10::ScalarType::Float:
      return omni::DType::kF32;
    case c10::ScalarType::Double:
      return omni::DType::kF64;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tensors of type ", c10::toString(type), " cannot be checkpointed"));
  }
}

// ---------------------------------------------------------------- module
absl::Status ModuleState::Save(omni::StateWriter& w) const {
  for (const auto& p : module_.named_parameters(/*recurse=*/true)) {
    if (auto st = SaveTensor(w, "param/" + p.key(), p.value()); !st.ok()) return st;
  }
  for (const auto& b : module_.named_buffers(/*recurse=*/true)) {
    if (auto st = SaveTensor(w, "buffer/" + b.key(), b.value()); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status ModuleState::Load(const omni::StateReader& r) {
  // Check every key first, so that a model with other shapes fails before
  // anything is overwritten.
  for (const auto& p : module_.named_parameters(true)) {
    auto info = r.Find("param/" + p.key());
    if (!info.ok()) return info.status();
    if (info->shape != Shape(p.value())) {
      return absl::InvalidArgumentError(
          absl::StrCat("param/", p.key(), ": checkpoint shape differs from the model's (",
                       c10::str(p.value().sizes()), ")"));
    }
  }
  for (auto& p : module_.named_parameters(true)) {
    if (auto st = LoadTensor(r, "param/" + p.key(), p.value()); !st.ok()) return st;
  }
  for (auto& b : module_.named_buffers(true)) {
    if (auto st = LoadTensor(r, "buffer/" + b.key(), b.value()); !st.ok()) return st;
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- optimizer
absl::Status OptimizerState::Save(omni::StateWriter& w) const {
  const Kind kind = KindOf(optimizer_);
  if (kind == Kind::kOther) {
    return absl::UnimplementedError("optimizer state: only SGD, Adam and AdamW are supported");
  }
  auto& groups = optimizer_.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    if (auto st = PutF64(w, absl::StrCat("group/", g, "/lr"), GroupLr(groups[g])); !st.ok()) {
      return st;
    }
  }
  using Map = std::decay_t<decltype(optimizer_.state())>;
  const std::vector<torch::Tensor> params = AllParams(optimizer_);
  auto& state = optimizer_.state();
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = state.find(StateKey<Map>(params[i]));
    if (it == state.end()) continue;  // no step taken for this parameter yet
    const std::string p = absl::StrCat("param/", i, "/");
    absl::Status st;
    if (kind == Kind::kAdam) {
      st = SaveMoments(w, p, static_cast<const torch::optim::AdamParamState&>(*it->second));
    } else if (kind == Kind::kAdamW) {
      st = SaveMoments(w, p, static_cast<const torch::optim::AdamWParamState&>(*it->second));
    } else {
      const auto& s = static_cast<const torch::optim::SGDParamState&>(*it->second);
      if (s.momentum_buffer().defined())
        st = SaveTensor(w, p + "momentum_buffer", s.momentum_buffer());
    }
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status OptimizerState::Load(const omni::StateReader& r) {
  const Kind kind = KindOf(optimizer_);
  if (kind == Kind::kOther) {
    return absl::UnimplementedError("optimizer state: only SGD, Adam and AdamW are supported");
  }
  auto& groups = optimizer_.param_groups();
  std::vector<double> lrs;
  for (size_t g = 0; g < groups.size(); ++g) {
    auto lr = GetF64(r, absl::StrCat("group/", g, "/lr"));
    if (!lr.ok()) return lr.status();
    lrs.push_back(*lr);
  }
  using Map = std::decay_t<decltype(optimizer_.state())>;
  const std::vector<torch::Tensor> params = AllParams(optimizer_);
  Map loaded;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string p = absl::StrCat("param/", i, "/");
    if (r.Keys(p).empty()) continue;
    if (kind == Kind::kAdam || kind == Kind::kAdamW) {
      absl::Status st;
      if (kind == Kind::kAdam) {
        auto s = LoadMoments<torch::optim::AdamParamState>(r, p, params[i]);
        if (!s.ok()) return s.status();
        loaded[StateKey<Map>(params[i])] = *std::move(s);
      } else {
        auto s = LoadMoments<torch::optim::AdamWParamState>(r, p, params[i]);
        if (!s.ok()) return s.status();
        loaded[StateKey<Map>(params[i])] = *std::move(s);
      }
    } else {
      auto mb = LoadNewTensor(r, p + "momentum_buffer", params[i]);
      if (!mb.ok()) return mb.status();
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(*mb);
      loaded[StateKey<Map>(params[i])] = std::move(s);
    }
  }
  // Everything read: now change the optimizer.
  for (size_t g = 0; g < groups.size(); ++g) SetGroupLr(groups[g], lrs[g]);
  optimizer_.state() = std::move(loaded);
  return absl::OkStatus();
}

// ---------------------------------------------------------------- LR schedule
WarmupCosineSchedule::WarmupCosineSchedule(torch::optim::Optimizer& optimizer, double base_lr,
                                           int64_t warmup_steps, int64_t total_steps,
                                           double min_factor)
    : optimizer_(optimizer),
      base_lr_(base_lr),
      warmup_(warmup_steps),
      total_(total_steps),
      min_factor_(min_factor) {}

double WarmupCosineSchedule::LrAt(int64_t step) const {
  if (warmup_ > 0 && step < warmup_) {
    return base_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
  }
  const double span = static_cast<double>(std::max<int64_t>(total_ - warmup_, 1));
  const double x = std::min(1.0, static_cast<double>(step - warmup_) / span);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * x));
  return base_lr_ * (min_factor_ + (1.0 - min_factor_) * cosine);
}

void WarmupCosineSchedule::Step() {
  const double lr = LrAt(steps_);
  for (auto& g : optimizer_.param_groups()) SetGroupLr(g, lr);
  ++steps_;
}

absl::Status WarmupCosineSchedule::Save(omni::StateWriter& w) const {
  if (auto st = PutI64(w, "steps", steps_); !st.ok()) return st;
  return PutF64(w, "base_lr", base_lr_);
}

absl::Status WarmupCosineSchedule::Load(const omni::StateReader& r) {
  auto steps = GetI64(r, "steps");
  if (!steps.ok()) return steps.status();
  auto base = GetF64(r, "base_lr");
  if (!base.ok()) return base.status();
  if (*base != base_lr_) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr/base_lr: checkpoint has ", *base, ", this run uses ", base_lr_));
  }
  steps_ = *steps;
  return absl::OkStatus();
}

// ---------------------------------------------------------------- RNG
RngState::RngState() = default;

void RngState::AddEngine(std::string name, std::mt19937_64* engine) {
  engines_[std::move(name)] = engine;
}

namespace {
absl::Status SaveGenerator(omni::StateWriter& w, const std::string& key, const at::Generator& g) {
  at::Generator gen = g;  // shares the implementation
  torch::Tensor s;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    s = gen.get_state();
  }
  return SaveTensor(w, key, s);
}
absl::Status LoadGenerator(const omni::StateReader& r, const std::string& key,
                           const at::Generator& g) {
  auto info = r.Find(key);
  if (!info.ok()) return info.status();
  torch::Tensor s = torch::empty(info->shape, torch::kUInt8);
  if (auto st = r.ReadTensor(key, omni::DType::kU8, info->shape, s.data_ptr(), s.nbytes());
      !st.ok()) {
    return st;
  }
  at::Generator gen = g;  // shares the implementation
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(s);
  return absl::OkStatus();
}
}  // namespace

absl::Status RngState::Save(omni::StateWriter& w) const {
  if (auto st = SaveGenerator(w, "torch_cpu", at::globalContext().defaultGenerator(at::kCPU));
      !st.ok()) {
    return st;
  }
  const int64_t devices = static_cast<int64_t>(torch::cuda::device_count());
  for (int64_t i = 0; i < devices; ++i) {
    const auto& g = at::globalContext().defaultGenerator(
        at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(i)));
    if (auto st = SaveGenerator(w, absl::StrCat("cuda/", i), g); !st.ok()) return st;
  }
  for (const auto& [name, engine] : engines_) {
    std::ostringstream os;
    os << *engine;
    if (auto st = w.PutBytes("engine/" + name, os.str()); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status RngState::Load(const omni::StateReader& r) {
  // Parse everything before changing any generator.
  std::map<std::string, std::mt19937_64> parsed;
  for (const auto& [name, engine] : engines_) {
    auto bytes = r.ReadBytes("engine/" + name);
    if (!bytes.ok()) return bytes.status();
    std::istringstream is(*bytes);
    std::mt19937_64 e;
    is >> e;
    if (is.fail()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rng/engine/", name, ": malformed engine state"));
    }
    parsed[name] = e;
  }
  const int64_t devices = static_cast<int64_t>(torch::cuda::device_count());
  for (int64_t i = 0; i < devices; ++i) {
    if (!r.Find(absl::StrCat("cuda/", i)).ok()) {
      return absl::NotFoundError(absl::StrCat("rng/cuda/", i,
                                              ": the checkpoint has no state for CUDA device ", i,
                                              " (saved with fewer devices)"));
    }
  }
  if (auto st = LoadGenerator(r, "torch_cpu", at::globalContext().defaultGenerator(at::kCPU));
      !st.ok()) {
    return st;
  }
  for (int64_t i = 0; i < devices; ++i) {
    const auto& g = at::globalContext().defaultGenerator(
        at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(i)));
    if (auto st = LoadGenerator(r, absl::StrCat("cuda/", i), g); !st.ok()) return st;
  }
  for (auto& [name, engine] : engines_) *engine = parsed[name];
  return absl::OkStatus();
}

}  // namespace omni::torch_ext
