// The LibTorch adapters (omni::torch_ext) through a real CheckpointManager:
// training continued from a checkpoint equals training without one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <vector>

#include "omni/checkpoint.h"
#include "omni/hash.h"
#include "omni/torch/params.h"
#include "omni/torch/state.h"

namespace omni::torch_ext {
namespace {

namespace fs = std::filesystem;

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    bn = register_module("bn", torch::nn::BatchNorm1d(16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::dropout(torch::relu(bn(fc1(x))), 0.2, is_training());  // uses the CPU RNG
    return fc2(x);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

class Dir {
 public:
  Dir()
      : path_(fs::temp_directory_path() /
              ("omni_torch_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++))) {}
  ~Dir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

// A training run: model, optimizer, schedule, RNGs, registered for checkpoints.
template <typename Opt, typename Options>
struct Run {
  explicit Run(Options opts)
      : optimizer(net->parameters(), opts),
        schedule(optimizer, 0.05, 3, 20),
        model_state(*net),
        optim_state(optimizer) {
    rng.AddEngine("noise", &engine);
    EXPECT_TRUE(registry.Register("model", &model_state).ok());
    EXPECT_TRUE(registry.Register("optim", &optim_state).ok());
    EXPECT_TRUE(registry.Register("lr", &schedule).ok());
    EXPECT_TRUE(registry.Register("rng", &rng).ok());
  }
  float Step() {
    torch::Tensor x = torch::randn({32, 8});
    x += static_cast<float>(std::uniform_real_distribution<double>(0, 1)(engine));
    optimizer.zero_grad();
    torch::Tensor loss = net->forward(x).pow(2).mean();
    loss.backward();
    schedule.Step();
    optimizer.step();
    return loss.item<float>();
  }
  std::shared_ptr<Net> net = std::make_shared<Net>();
  Opt optimizer;
  WarmupCosineSchedule schedule;
  std::mt19937_64 engine{7};
  ModuleState model_state;
  OptimizerState optim_state;
  RngState rng;
  StateRegistry registry;
};

template <typename Opt, typename Options>
void ExpectBitExactContinuation(Options opts) {
  Dir dir;
  torch::manual_seed(1);
  Run<Opt, Options> a(opts);
  for (int i = 0; i < 5; ++i) a.Step();
  CheckpointOptions co;
  co.dir = dir.str();
  auto mgr = CheckpointManager::Open(co);
  ASSERT_TRUE(mgr.ok()) << mgr.status();
  ASSERT_TRUE((*mgr)->Save(5, a.registry, {}).ok());
  std::vector<float> expected;
  for (int i = 0; i < 5; ++i) expected.push_back(a.Step());
  const uint64_t digest = *ParamsXxh3(*a.net);

  torch::manual_seed(999);  // a different start: everything must come from the checkpoint
  Run<Opt, Options> b(opts);
  b.engine.seed(12345);
  auto restored = (*mgr)->Restore(b.registry);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->info.step, 5);
  EXPECT_EQ(b.schedule.steps_taken(), 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(b.Step(), expected[static_cast<size_t>(i)]) << "step " << i;
  EXPECT_EQ(*ParamsXxh3(*b.net), digest);
}

TEST(TorchState, AdamWContinuesBitExactlyFromACheckpoint) {
  ExpectBitExactContinuation<torch::optim::AdamW>(
      torch::optim::AdamWOptions(0.05).weight_decay(0.1));
}

TEST(TorchState, AdamWithAmsgradContinuesBitExactly) {
  ExpectBitExactContinuation<torch::optim::Adam>(torch::optim::AdamOptions(0.05).amsgrad(true));
}

TEST(TorchState, SgdWithMomentumContinuesBitExactly) {
  ExpectBitExactContinuation<torch::optim::SGD>(torch::optim::SGDOptions(0.05).momentum(0.9));
}

TEST(TorchState, AModelWithOtherShapesIsRefusedNamingTheKeyAndLeftUntouched) {
  Dir dir;
  Net net;
  ModuleState ms(net);
  StateRegistry reg;
  ASSERT_TRUE(reg.Register("model", &ms).ok());
  CheckpointOptions co;
  co.dir = dir.str();
  auto mgr = CheckpointManager::Open(co);
  ASSERT_TRUE((*mgr)->Save(1, reg, {}).ok());

  struct Wider : torch::nn::Module {
    Wider() {
      fc1 = register_module("fc1", torch::nn::Linear(8, 32));
      bn = register_module("bn", torch::nn::BatchNorm1d(32));
      fc2 = register_module("fc2", torch::nn::Linear(32, 4));
    }
    torch::nn::Linear fc1{nullptr}, fc2{nullptr};
    torch::nn::BatchNorm1d bn{nullptr};
  } wider;
  const uint64_t before = *ParamsXxh3(wider);
  ModuleState ws(wider);
  StateRegistry reg2;
  ASSERT_TRUE(reg2.Register("model", &ws).ok());
  auto r = (*mgr)->Restore(reg2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("fc1.weight"), absl::string_view::npos) << r.status();
  EXPECT_EQ(*ParamsXxh3(wider), before);
}

TEST(TorchState, RngStateRestoresTheCpuGeneratorAndEngines) {
  Dir dir;
  std::mt19937_64 engine(3);
  RngState rng;
  rng.AddEngine("mine", &engine);
  StateRegistry reg;
  ASSERT_TRUE(reg.Register("rng", &rng).ok());
  CheckpointOptions co;
  co.dir = dir.str();
  auto mgr = CheckpointManager::Open(co);
  torch::manual_seed(42);
  ASSERT_TRUE((*mgr)->Save(1, reg, {}).ok());
  const torch::Tensor expected = torch::rand({4});
  const uint64_t expected_engine = engine();
  torch::manual_seed(7);
  engine.seed(99);
  ASSERT_TRUE((*mgr)->Restore(reg).ok());
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected));
  EXPECT_EQ(engine(), expected_engine);
}

// Runs on a GPU host (tests/gpu/run.sh); skipped where LibTorch has no CUDA
// device.
TEST(TorchState, RngStateRestoresEveryCudaGenerator) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device: checked by tests/gpu/run.sh";
  Dir dir;
  RngState rng;
  StateRegistry reg;
  ASSERT_TRUE(reg.Register("rng", &rng).ok());
  CheckpointOptions co;
  co.dir = dir.str();
  auto mgr = CheckpointManager::Open(co);
  ASSERT_TRUE(mgr.ok()) << mgr.status();
  const auto devices = static_cast<int64_t>(torch::cuda::device_count());
  torch::manual_seed(42);                  // seeds every CUDA generator too
  for (int64_t d = 0; d < devices; ++d) {  // move each device's generator along
    (void)torch::rand({static_cast<int64_t>(d) + 3}, torch::Device(torch::kCUDA, d));
  }
  ASSERT_TRUE((*mgr)->Save(1, reg, {}).ok());
  std::vector<torch::Tensor> expected;
  for (int64_t d = 0; d < devices; ++d) {
    expected.push_back(torch::rand({5}, torch::Device(torch::kCUDA, d)).cpu());
  }
  torch::manual_seed(7);
  ASSERT_TRUE((*mgr)->Restore(reg).ok());
  for (int64_t d = 0; d < devices; ++d) {
    EXPECT_TRUE(torch::equal(torch::rand({5}, torch::Device(torch::kCUDA, d)).cpu(),
                             expected[static_cast<size_t>(d)]))
        << "CUDA device " << d;
  }
}

TEST(TorchState, ToDTypeRefusesComplexTensors) {
  EXPECT_EQ(*ToDType(torch::kFloat), DType::kF32);
  EXPECT_EQ(*ToDType(torch::kBFloat16), DType::kBF16);
  EXPECT_FALSE(ToDType(torch::kComplexFloat).ok());
}

}  // namespace
}  // namespace omni::torch_ext
