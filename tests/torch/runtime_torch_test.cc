// omni::torch helpers for the Runtime: TrainState (everything registered in
// one call, a resumed Runtime continues bit-exactly), the gradient all-reduce
// (replicas as threads over a FileStore, real Gloo), and a resumable
// torch::data loader (prefetching workers, a resume mid-epoch).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../unit/auto_advance.h"
#include "../unit/temp_dir.h"
#include "omni/config.h"
#include "omni/elastic.h"
#include "omni/runtime.h"
#include "omni/torch/data_loader.h"
#include "omni/torch/grad_sync.h"
#include "omni/torch/params.h"
#include "omni/torch/state.h"
#include "omni/torch/train_state.h"

namespace omni::torch_ext {
namespace {

namespace fs = std::filesystem;

using test_util::TempDir;

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2(torch::dropout(torch::relu(fc1(x)), 0.2, is_training()));  // draws the CPU RNG
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

RuntimeOptions Options(const TempDir& dir, FakeClock* clock) {
  RuntimeOptions o;
  o.clock = clock;
  o.ckpt_dir = dir / "ckpt";
  o.handle_preemption = false;
  o.telemetry.forecast_enabled = false;
  o.log = [](const std::string&) {};
  return o;
}

// Trains steps [rt.step(), until) of a two-model, two-optimizer loop.
void Train(Runtime& rt, Net& a, Net& b, torch::optim::Optimizer& oa, torch::optim::Optimizer& ob,
           int64_t until) {
  while (rt.step() < until) {
    ASSERT_TRUE(rt.BeginStep().ok());
    const torch::Tensor x = torch::randn({4, 8});
    oa.zero_grad();
    ob.zero_grad();
    (a.forward(x).pow(2).mean() + b.forward(x).abs().mean()).backward();
    oa.step();
    ob.step();
    ASSERT_TRUE(rt.EndStep().ok());
  }
}

TEST(TrainState, TwoModelsTwoOptimizersAndTheRngResumeBitExactly) {
  TempDir ref_dir, dir;
  FakeClock clock;
  uint64_t reference = 0;
  {
    torch::manual_seed(3);
    Net a, b;
    torch::optim::Adam oa(a.parameters(), 1e-2);
    torch::optim::SGD ob(b.parameters(), torch::optim::SGDOptions(1e-2).momentum(0.9));
    auto rt = *Runtime::Create(Options(ref_dir, &clock));
    TrainState state;
    state.AddModule("a", a).AddModule("b", b).AddOptimizer("oa", oa).AddOptimizer("ob", ob);
    ASSERT_TRUE(state.RegisterWith(*rt).ok());
    ASSERT_EQ(*rt->Start(), 0);
    Train(*rt, a, b, oa, ob, 10);
    reference = *ParamsXxh3(a) ^ (*ParamsXxh3(b) * 31);
  }
  {
    torch::manual_seed(3);
    Net a, b;
    torch::optim::Adam oa(a.parameters(), 1e-2);
    torch::optim::SGD ob(b.parameters(), torch::optim::SGDOptions(1e-2).momentum(0.9));
    RuntimeOptions o = Options(dir, &clock);
    o.ckpt_every = 4;
    auto rt = *Runtime::Create(o);
    TrainState state;
    state.AddModule("a", a).AddModule("b", b).AddOptimizer("oa", oa).AddOptimizer("ob", ob);
    ASSERT_TRUE(state.RegisterWith(*rt).ok());
    ASSERT_EQ(*rt->Start(), 0);
    Train(*rt, a, b, oa, ob, 6);  // checkpoint at 4; steps 5 and 6 are lost
  }
  torch::manual_seed(99);  // another RNG state: the checkpoint's must win
  Net a, b;
  torch::optim::Adam oa(a.parameters(), 1e-2);
  torch::optim::SGD ob(b.parameters(), torch::optim::SGDOptions(1e-2).momentum(0.9));
  auto rt = *Runtime::Create(Options(dir, &clock));
  TrainState state;
  state.AddModule("a", a).AddModule("b", b).AddOptimizer("oa", oa).AddOptimizer("ob", ob);
  ASSERT_TRUE(state.RegisterWith(*rt).ok());
  ASSERT_EQ(*rt->Start(), 4);
  Train(*rt, a, b, oa, ob, 10);
  EXPECT_EQ(*ParamsXxh3(a) ^ (*ParamsXxh3(b) * 31), reference);
}

TEST(TrainState, ADuplicateNameIsRefusedNamingIt) {
  TempDir dir;
  FakeClock clock;
  Net a;
  auto rt = *Runtime::Create(Options(dir, &clock));
  TrainState state;
  state.AddModule("net", a).AddModule("net", a);
  absl::Status st = state.RegisterWith(*rt);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("net"), std::string::npos) << st;
}

TEST(AllReduceGradients, WithoutAGroupLeavesTheGradientsAlone) {
  TempDir dir;
  FakeClock clock;
  Net a;
  auto rt = *Runtime::Create(Options(dir, &clock));
  ASSERT_TRUE(rt->Start().ok());
  a.forward(torch::ones({2, 8})).sum().backward();
  const torch::Tensor before = a.fc1->weight.grad().clone();
  ASSERT_TRUE(rt->BeginStep().ok());
  ASSERT_TRUE(AllReduceGradients(*rt, a.parameters()).ok());
  EXPECT_TRUE(torch::equal(a.fc1->weight.grad(), before));
}

#if OMNI_HAVE_GLOO
TEST(AllReduceGradients, SumsEveryGradientInPlaceAcrossReplicasWithSmallBuckets) {
  TempDir dir;
  FakeClock clock;
  test_util::AutoAdvance advance(clock);  // the group waits on it
  constexpr int kN = 2;
  std::vector<torch::Tensor> got(kN * 4);
  std::vector<void*> weight_ptr(kN), weight_grad_ptr(kN);
  std::vector<std::thread> threads;
  for (int i = 0; i < kN; ++i) {
    threads.emplace_back([&, i] {
      RuntimeOptions o = Options(dir, &clock);
      o.ckpt_dir.clear();
      o.store_uri = "file://" + (dir / "store");
      o.elastic.membership.self.id = "r" + std::to_string(i);
      o.elastic.membership.max_replicas = kN;
      auto rt = Runtime::Create(o);
      ASSERT_TRUE(rt.ok()) << rt.status();
      Net net;
      absl::StatusOr<int64_t> started = (*rt)->Start();
      ASSERT_TRUE(started.ok()) << started.status();
      for (auto& p : net.parameters()) p.mutable_grad() = torch::full_like(p, i + 1.0);
      if (i == 0) net.fc2->bias.mutable_grad() = torch::Tensor();  // none on r0's side
      weight_grad_ptr[i] = net.fc1->weight.grad().data_ptr();
      ASSERT_TRUE((*rt)->BeginStep().ok());
      GradSyncOptions g;
      g.bucket_bytes = 200;  // fc1.weight (512 B) alone and in place; the rest packed
      ASSERT_TRUE(AllReduceGradients(**rt, net.parameters(), g).ok());
      weight_ptr[i] = net.fc1->weight.grad().data_ptr();
      const auto params = net.parameters();
      for (size_t k = 0; k < params.size(); ++k) got[i * 4 + k] = params[k].grad().clone();
      ASSERT_TRUE((*rt)->EndStep().ok());
      ASSERT_TRUE((*rt)->Finish().ok());
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(weight_ptr[i], weight_grad_ptr[i]);  // reduced where it lives
    for (int k = 0; k < 3; ++k)
      EXPECT_TRUE(torch::allclose(got[i * 4 + k], torch::full_like(got[i * 4 + k], 3.0)));
    EXPECT_TRUE(torch::allclose(got[i * 4 + 3], torch::full_like(got[i * 4 + 3], 2.0)));  // 0 + 2
  }
}

// A parameter that no replica computed a gradient for (unused by the step
// everywhere) must keep none, so that the optimizer skips it as a single
// process does: a zero gradient would still get AdamW's weight decay (before
// the fix, an elastic omni_train decayed its unused image encoder and ended
// 6.6e-4 away from the single process even in float64).
TEST(AllReduceGradients, AParameterWithoutAGradientOnEveryReplicaKeepsNoneAndIsNotDecayed) {
  TempDir dir;
  FakeClock clock;
  test_util::AutoAdvance advance(clock);  // the group waits on it
  constexpr int kN = 2;
  std::vector<int> bias_has_grad(kN, 1);
  std::vector<torch::Tensor> bias_after(kN), weight_grad(kN);
  std::vector<std::thread> threads;
  for (int i = 0; i < kN; ++i) {
    threads.emplace_back([&, i] {
      RuntimeOptions o = Options(dir, &clock);
      o.ckpt_dir.clear();
      o.store_uri = "file://" + (dir / "store");
      o.elastic.membership.self.id = "r" + std::to_string(i);
      o.elastic.membership.max_replicas = kN;
      auto rt = Runtime::Create(o);
      ASSERT_TRUE(rt.ok()) << rt.status();
      Net net;
      torch::optim::AdamW opt(net.parameters(), torch::optim::AdamWOptions(0.1).weight_decay(0.5));
      absl::StatusOr<int64_t> started = (*rt)->Start();
      ASSERT_TRUE(started.ok()) << started.status();
      for (auto& p : net.parameters()) p.mutable_grad() = torch::full_like(p, i + 1.0);
      net.fc2->bias.mutable_grad() = torch::Tensor();  // unused on both replicas
      const torch::Tensor bias_before = net.fc2->bias.detach().clone();
      ASSERT_TRUE((*rt)->BeginStep().ok());
      ASSERT_TRUE(AllReduceGradients(**rt, net.parameters()).ok());
      bias_has_grad[i] = net.fc2->bias.grad().defined() ? 1 : 0;
      weight_grad[i] = net.fc1->weight.grad().clone();
      opt.step();
      bias_after[i] = net.fc2->bias.detach().clone();
      EXPECT_TRUE(torch::equal(bias_after[i], bias_before));
      ASSERT_TRUE((*rt)->EndStep().ok());
      ASSERT_TRUE((*rt)->Finish().ok());
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kN; ++i) {
    EXPECT_FALSE(bias_has_grad[i]) << "replica " << i;
    EXPECT_TRUE(torch::allclose(weight_grad[i], torch::full_like(weight_grad[i], 3.0)));
  }
}
#endif  // OMNI_HAVE_GLOO

// A dataset whose example i is the number i.
struct Numbers : torch::data::datasets::Dataset<Numbers> {
  explicit Numbers(int64_t n) : n_(n) {}
  torch::data::Example<> get(size_t i) override {
    return {torch::tensor(static_cast<int64_t>(i)), torch::tensor(0)};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(n_); }
  int64_t n_;
};

using Loader =
    decltype(torch::data::make_data_loader(Numbers(1).map(torch::data::transforms::Stack<>()),
                                           ResumableSampler<torch::data::samplers::RandomSampler>(
                                               torch::data::samplers::RandomSampler(1), nullptr),
                                           torch::data::DataLoaderOptions()));

std::unique_ptr<typename Loader::element_type> MakeLoader(std::shared_ptr<LoaderPosition> pos) {
  return torch::data::make_data_loader(
      Numbers(40).map(torch::data::transforms::Stack<>()),
      ResumableSampler<torch::data::samplers::RandomSampler>(
          torch::data::samplers::RandomSampler(40), std::move(pos)),
      torch::data::DataLoaderOptions().batch_size(4).workers(2).max_jobs(4));
}

// Consumes `batches` batches over epochs; the first of each batch's numbers.
std::vector<int64_t> Consume(typename Loader::element_type& loader, LoaderPosition& pos,
                             int batches) {
  std::vector<int64_t> seen;
  while (static_cast<int>(seen.size()) < batches * 4) {
    for (auto& batch : loader) {
      const torch::Tensor d = batch.data;
      for (int64_t k = 0; k < d.size(0); ++k) seen.push_back(d[k].item<int64_t>());
      pos.Consumed();
      if (static_cast<int>(seen.size()) >= batches * 4) return seen;
    }
  }
  return seen;
}

TEST(ResumableSampler, AResumeMidEpochServesExactlyWhatWasNotConsumedDespitePrefetch) {
  TempDir dir;
  FakeClock clock;
  torch::manual_seed(7);
  auto ref_pos = std::make_shared<LoaderPosition>();
  auto ref_loader = MakeLoader(ref_pos);
  const std::vector<int64_t> reference = Consume(*ref_loader, *ref_pos, 25);  // 2.5 epochs

  RuntimeOptions o = Options(dir, &clock);
  o.ckpt_every = 1;
  torch::manual_seed(7);
  {
    auto pos = std::make_shared<LoaderPosition>();
    auto loader = MakeLoader(pos);
    auto rt = *Runtime::Create(o);
    ASSERT_TRUE(rt->Register("loader", pos.get()).ok());
    RngState rng;
    ASSERT_TRUE(rt->Register("rng", &rng, StateScope::kPerReplica).ok());
    ASSERT_TRUE(rt->Start().ok());
    const std::vector<int64_t> first = Consume(*loader, *pos, 13);  // 3 batches into epoch 2
    ASSERT_EQ(std::vector<int64_t>(reference.begin(), reference.begin() + 52), first);
    EXPECT_EQ(pos->epoch(), 2);
    EXPECT_EQ(pos->consumed_samples(), 12);
    ASSERT_TRUE(rt->BeginStep().ok());
    ASSERT_TRUE(rt->EndStep().ok());  // the checkpoint of step 1 holds the position
  }
  torch::manual_seed(123);  // the restored RNG must win for the next epoch's shuffle
  auto pos = std::make_shared<LoaderPosition>();
  auto loader = MakeLoader(pos);
  auto rt = *Runtime::Create(o);
  ASSERT_TRUE(rt->Register("loader", pos.get()).ok());
  RngState rng;
  ASSERT_TRUE(rt->Register("rng", &rng, StateScope::kPerReplica).ok());
  ASSERT_EQ(*rt->Start(), 1);
  const std::vector<int64_t> rest = Consume(*loader, *pos, 12);
  EXPECT_EQ(std::vector<int64_t>(reference.begin() + 52, reference.end()), rest);
  EXPECT_EQ(pos->epoch(), 3);
}

TEST(ResumableSampler, APositionSavedAtTheEndOfAnEpochResumesWithTheNextEpochShuffledAsItWouldBe) {
  TempDir dir;
  FakeClock clock;
  torch::manual_seed(7);
  auto ref_pos = std::make_shared<LoaderPosition>();
  auto ref_loader = MakeLoader(ref_pos);
  const std::vector<int64_t> reference = Consume(*ref_loader, *ref_pos, 20);  // 2 epochs

  RuntimeOptions o = Options(dir, &clock);
  o.ckpt_every = 1;
  torch::manual_seed(7);
  {
    auto pos = std::make_shared<LoaderPosition>();
    auto loader = MakeLoader(pos);
    auto rt = *Runtime::Create(o);
    ASSERT_TRUE(rt->Register("loader", pos.get()).ok());
    RngState rng;
    ASSERT_TRUE(rt->Register("rng", &rng, StateScope::kPerReplica).ok());
    ASSERT_TRUE(rt->Start().ok());
    ASSERT_EQ(Consume(*loader, *pos, 10),
              std::vector<int64_t>(reference.begin(), reference.begin() + 40));
    EXPECT_EQ(pos->consumed_samples(), 40);  // all of epoch 1
    ASSERT_TRUE(rt->BeginStep().ok());
    ASSERT_TRUE(rt->EndStep().ok());
  }
  torch::manual_seed(123);
  auto pos = std::make_shared<LoaderPosition>();
  auto loader = MakeLoader(pos);
  auto rt = *Runtime::Create(o);
  ASSERT_TRUE(rt->Register("loader", pos.get()).ok());
  RngState rng;
  ASSERT_TRUE(rt->Register("rng", &rng, StateScope::kPerReplica).ok());
  ASSERT_EQ(*rt->Start(), 1);
  // One pass of the loader: the whole of epoch 2, not an empty epoch 1.
  std::vector<int64_t> rest;
  for (auto& batch : *loader) {
    for (int64_t k = 0; k < batch.data.size(0); ++k) rest.push_back(batch.data[k].item<int64_t>());
    pos->Consumed();
  }
  EXPECT_EQ(std::vector<int64_t>(reference.begin() + 40, reference.end()), rest);
  EXPECT_EQ(pos->epoch(), 2);
}

// The DCGAN port's way: MakeDataLoader registers the position through the
// TrainState, and the Runtime counts a batch consumed at each commit.
TEST(TrainState, MakeDataLoaderResumesMidEpochCountingOneBatchPerCommittedStep) {
  TempDir dir;
  FakeClock clock;
  auto run = [&](int64_t steps, std::vector<int64_t>* seen) -> int64_t {
    torch::manual_seed(7);
    TrainState state;
    auto loader = MakeDataLoader(state, Numbers(40).map(torch::data::transforms::Stack<>()),
                                 torch::data::DataLoaderOptions().batch_size(4).workers(2));
    RuntimeOptions o = Options(dir, &clock);
    o.ckpt_every = 3;
    o.total_steps = steps;
    auto rt = Check(Runtime::Create(o));
    Check(state.RegisterWith(*rt));
    const int64_t start = Check(rt->Start());
    while (!rt->done()) {
      for (auto& batch : *loader) {
        Check(rt->BeginStep());
        seen->push_back(batch.data[0].item<int64_t>());
        Check(rt->EndStep());
        if (rt->done()) break;
      }
    }
    return start;
  };
  std::vector<int64_t> reference, first, rest;
  {
    torch::manual_seed(7);
    TrainState state;
    auto loader = MakeDataLoader(state, Numbers(40).map(torch::data::transforms::Stack<>()),
                                 torch::data::DataLoaderOptions().batch_size(4).workers(2));
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (auto& batch : *loader) reference.push_back(batch.data[0].item<int64_t>());
    }
  }
  EXPECT_EQ(run(13, &first), 0);  // the last checkpoint: step 12, in epoch 2
  ASSERT_EQ(first, std::vector<int64_t>(reference.begin(), reference.begin() + 13));
  EXPECT_EQ(run(20, &rest), 12);
  EXPECT_EQ(rest, std::vector<int64_t>(reference.begin() + 12, reference.end()));
}

}  // namespace
}  // namespace omni::torch_ext
