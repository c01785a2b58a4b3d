// ElasticGroup over each communicator backend, replicas as processes
// (fork_ranks.h): the same scenarios run on gloo here and on nccl on a GPU
// host (tests/gpu/run.sh), where the gradients are device memory and the
// group's digests and state go through the NCCL communicator's staging.
// A variant whose backend was not built, or whose GPUs are missing, skips
// naming what it needs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "fork_ranks.h"
#include "omni/config.h"
#include "omni/elastic.h"
#include "omni/state.h"
#include "omni/store.h"
#include "replica_state.h"

namespace omni {
namespace {

using test_util::DeviceCount;
using test_util::ForkIn;
using test_util::MakeReplica;
using test_util::Outcome;
using test_util::Replica;
using test_util::ShmDir;

constexpr size_t kWeights = size_t{1} << 16;
constexpr absl::Duration kAlone = absl::Milliseconds(200);  // settle: one replica
constexpr absl::Duration kBoth = absl::Seconds(20);         // settle: wait for both

// Gradients where the backend wants them: CUDA memory for nccl, host memory
// for gloo.
class Gradients {
 public:
  Gradients(bool on_device, size_t n) : host_(n) {
#if OMNI_HAVE_NCCL
    if (on_device && cudaMalloc(&device_, n * sizeof(float)) != cudaSuccess) device_ = nullptr;
#else
    (void)on_device;
#endif
  }
  ~Gradients() {
#if OMNI_HAVE_NCCL
    if (device_ != nullptr) cudaFree(device_);
#endif
  }
  Gradients(const Gradients&) = delete;
  Gradients& operator=(const Gradients&) = delete;

  float* data() { return device_ != nullptr ? static_cast<float*>(device_) : host_.data(); }
  size_t size() const { return host_.size(); }
  void Fill(float v) {
    std::fill(host_.begin(), host_.end(), v);
#if OMNI_HAVE_NCCL
    if (device_ != nullptr) {
      cudaMemcpy(device_, host_.data(), host_.size() * sizeof(float), cudaMemcpyHostToDevice);
    }
#endif
  }
  const std::vector<float>& Host() {
#if OMNI_HAVE_NCCL
    if (device_ != nullptr) {
      cudaMemcpy(host_.data(), device_, host_.size() * sizeof(float), cudaMemcpyDeviceToHost);
    }
#endif
    return host_;
  }

 private:
  std::vector<float> host_;
  void* device_ = nullptr;
};

// One replica is enough to train (a survivor goes on alone); the first
// generation forms once `settle` passed without a new registration, or at
// once with both replicas.
ElasticOptions Options(const std::string& backend, const std::string& id, int device,
                       absl::Duration settle) {
  ElasticOptions o;
  o.backend = backend;
  o.device = backend == "nccl" ? device : -1;
  o.membership.job_id = "elastic-backend";
  o.membership.model_digest = "m";
  o.membership.self.id = id;
  o.membership.min_replicas = 1;
  o.membership.max_replicas = 2;
  o.membership.heartbeat = absl::Milliseconds(20);
  o.membership.peer_timeout = absl::Milliseconds(500);
  o.membership.settle = settle;
  o.membership.join_timeout = absl::Seconds(30);
  o.collective_timeout = absl::Seconds(30);
  o.init_timeout = absl::Seconds(30);
  return o;
}

// One training step of `rep` in `group`: this rank's gradient is rank + 1
// everywhere, summed over the group (device memory on nccl), and a loss
// summed on the host (staged on nccl); committed only when both succeed.
// "" or what went wrong.
std::string Step(ElasticGroup& group, Replica& rep, Gradients& grads, absl::Status* failed) {
  const int rank = group.generation().rank;
  const int n = group.generation().size();
  grads.Fill(static_cast<float>(rank + 1));
  absl::Status st = group.AllReduce(grads.data(), grads.size(), DType::kF32, ReduceOp::kSum);
  float loss = 1.0f;
  if (st.ok()) st = group.AllReduce(&loss, 1, DType::kF32, ReduceOp::kSum);
  if (!st.ok()) {
    if (failed != nullptr) *failed = st;
    return failed != nullptr ? "" : st.ToString();
  }
  const float want = static_cast<float>(n * (n + 1)) / 2.0f;
  const std::vector<float>& g = grads.Host();
  RANK_CHECK(g.front() == want && g.back() == want, "summed gradient ", g.front(), " want ", want);
  RANK_CHECK(loss == static_cast<float>(n), "summed loss ", loss, " want ", n);
  for (size_t i = 0; i < rep.weights.size(); ++i) rep.weights[i] += g[i];
  ++rep.step;
  return "";
}

// The state a replica passes to its restart (its checkpoint), in the store.
constexpr char kSavedKey[] = "test/saved_state";

class ElasticBackend : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "gloo" && !OMNI_HAVE_GLOO) GTEST_SKIP() << "omni was built without Gloo";
    if (GetParam() == "nccl") {
      if (!OMNI_HAVE_NCCL) GTEST_SKIP() << "omni was built without NCCL";
      devices_ = DeviceCount();
      if (devices_ == 0) GTEST_SKIP() << "needs a CUDA device (tests/gpu/run.sh), found none";
    }
  }
  bool nccl() const { return GetParam() == "nccl"; }
  int devices_ = 0;
};

// One replica through what a single GPU can show: collectives on device
// memory, a forced failure (its communicator aborted, as the heartbeat
// thread does when a peer dies), Recover into a new generation with a new
// communicator (NCCL aborted and initialised again), the state sent over
// the backend; then the replica stops and a new process under its id
// rejoins the job from its saved state.
TEST_P(ElasticBackend, OneReplicaRecoversFromAnAbortedCommunicatorAndRejoinsAfterARestart) {
  const std::string backend = GetParam();
  const bool on_device = nccl();
  ShmDir dir;
  std::vector<Outcome> out = ForkIn(dir, 1, [&](int rank, Store& store) -> std::string {
    auto rep = MakeReplica(kWeights, 0.0f);
    absl::StatusOr<std::unique_ptr<ElasticGroup>> group =
        ElasticGroup::Create(store, Options(backend, "r0", 0, kAlone), rep->state);
    RANK_CHECK(group.ok(), group.status().ToString());
    ElasticGroup& g = **group;
    absl::StatusOr<GroupChange> started = g.Start(0);
    RANK_CHECK(started.ok(), started.status().ToString());
    RANK_CHECK(started->generation.size() == 1, started->generation.ToString());
    RANK_CHECK(g.backend() == backend && std::string(g.comm().backend()) == backend,
               g.comm().backend());
    Gradients grads(on_device, kWeights);
    for (int i = 0; i < 3; ++i) {
      const std::string e = Step(g, *rep, grads, nullptr);
      RANK_CHECK(e.empty(), e);
    }

    // The forced failure: the step's collective fails, nothing is committed.
    const int64_t before = g.generation().number;
    g.comm().Abort();
    absl::Status failed;
    std::string e = Step(g, *rep, grads, &failed);
    RANK_CHECK(e.empty(), e);
    RANK_CHECK(absl::IsAborted(failed), failed.ToString());
    RANK_CHECK(rep->step == 3, "a failed step was committed: step ", rep->step);
    absl::StatusOr<GroupChange> recovered = g.Recover(failed, rep->step);
    RANK_CHECK(recovered.ok(), recovered.status().ToString());
    RANK_CHECK(recovered->generation.number > before, recovered->generation.ToString());
    RANK_CHECK(recovered->generation.kind == GenerationKind::kRecover,
               recovered->generation.ToString());
    RANK_CHECK(g.comm().AsyncError().ok(), g.comm().AsyncError().ToString());
    // The step again, on the new communicator, and one more.
    for (int i = 0; i < 2; ++i) {
      e = Step(g, *rep, grads, nullptr);
      RANK_CHECK(e.empty(), e);
    }
    RANK_CHECK(rep->step == 5 && rep->weights[0] == 5.0f, "step ", rep->step, " weight ",
               rep->weights[0]);

    // The state transfer's path: the serialized state broadcast over the
    // backend (host memory: staged on nccl) and loaded back unchanged.
    absl::StatusOr<std::string> bytes = SerializeState(rep->state);
    RANK_CHECK(bytes.ok(), bytes.status().ToString());
    std::string sent = *bytes;
    absl::Status st = g.Broadcast(sent.data(), sent.size(), 0);
    RANK_CHECK(st.ok(), st.ToString());
    RANK_CHECK(sent == *bytes, "the broadcast changed the state");
    st = DeserializeState(sent, rep->state);
    RANK_CHECK(st.ok(), st.ToString());
    st = store.Set(kSavedKey, sent);
    RANK_CHECK(st.ok(), st.ToString());
    st = store.Set("test/generation", std::to_string(g.generation().number));
    RANK_CHECK(st.ok(), st.ToString());
    return "";  // the group goes: heartbeats stop, the communicator closes
  });
  ASSERT_EQ(out[0].code, 0) << out[0].message;

  // The restart: same id, the saved state, a new generation.
  out = ForkIn(dir, 1, [&](int rank, Store& store) -> std::string {
    auto rep = MakeReplica(kWeights, 0.0f);
    absl::StatusOr<std::string> saved = store.Get(kSavedKey, absl::Seconds(5));
    RANK_CHECK(saved.ok(), saved.status().ToString());
    absl::Status st = DeserializeState(*saved, rep->state);
    RANK_CHECK(st.ok(), st.ToString());
    absl::StatusOr<std::string> last = store.Get("test/generation", absl::Seconds(5));
    RANK_CHECK(last.ok(), last.status().ToString());
    int64_t last_number = 0;
    RANK_CHECK(absl::SimpleAtoi(*last, &last_number), *last);
    absl::StatusOr<std::unique_ptr<ElasticGroup>> group =
        ElasticGroup::Create(store, Options(backend, "r0", 0, kAlone), rep->state);
    RANK_CHECK(group.ok(), group.status().ToString());
    absl::StatusOr<GroupChange> started = (*group)->Start(rep->step);
    RANK_CHECK(started.ok(), started.status().ToString());
    const Generation& gen = started->generation;
    RANK_CHECK(gen.number > last_number && gen.size() == 1 && gen.members[0].id == "r0",
               gen.ToString(), " after generation ", last_number);
    RANK_CHECK(started->completed == 5, "completed ", started->completed);
    Gradients grads(on_device, kWeights);
    const std::string e = Step(**group, *rep, grads, nullptr);
    RANK_CHECK(e.empty(), e);
    RANK_CHECK(rep->step == 6 && rep->weights.back() == 6.0f, "step ", rep->step, " weight ",
               rep->weights.back());
    return "";
  });
  EXPECT_EQ(out[0].code, 0) << out[0].message;
}

// Two replicas (one GPU each on nccl): the one behind receives the other's
// state at Start over the backend, both train, then one dies; the survivor's
// collective fails, it recovers alone and goes on.
TEST_P(ElasticBackend, TwoReplicasSyncTheLaggardThenTheSurvivorOfALossGoesOnAlone) {
  if (nccl() && devices_ < 2) {
    GTEST_SKIP() << "needs 2 CUDA devices (one per replica: NCCL refuses two ranks on one GPU), "
                    "found "
                 << devices_;
  }
  const std::string backend = GetParam();
  const bool on_device = nccl();
  ShmDir dir;
  const std::vector<Outcome> out = ForkIn(dir, 2, [&](int rank, Store& store) -> std::string {
    // Rank 0 restored a newer checkpoint (step 5); rank 1 starts fresh.
    auto rep = MakeReplica(kWeights, rank == 0 ? 1.0f : 0.0f);
    rep->step = rank == 0 ? 5 : 0;
    const std::string id = absl::StrCat("r", rank);
    absl::StatusOr<std::unique_ptr<ElasticGroup>> group =
        ElasticGroup::Create(store, Options(backend, id, rank, kBoth), rep->state);
    RANK_CHECK(group.ok(), group.status().ToString());
    ElasticGroup& g = **group;
    absl::StatusOr<GroupChange> started = g.Start(rep->step);
    RANK_CHECK(started.ok(), started.status().ToString());
    RANK_CHECK(started->generation.size() == 2, started->generation.ToString());
    RANK_CHECK(rep->step == 5 && rep->weights[kWeights - 1] == 1.0f, "after Start: step ",
               rep->step, " weight ", rep->weights[kWeights - 1]);
    RANK_CHECK(started->state_received == (rank == 1), "state_received ", started->state_received);
    Gradients grads(on_device, kWeights);
    std::string e = Step(g, *rep, grads, nullptr);
    RANK_CHECK(e.empty(), e);
    if (rank == 1) ::_exit(0);  // dies: no leave, no goodbye to its peer
    absl::Status failed;
    e = Step(g, *rep, grads, &failed);
    RANK_CHECK(e.empty(), e);
    RANK_CHECK(!failed.ok(), "a step with a dead peer succeeded");
    absl::StatusOr<GroupChange> recovered = g.Recover(failed, rep->step);
    RANK_CHECK(recovered.ok(), recovered.status().ToString());
    RANK_CHECK(recovered->generation.size() == 1 &&
                   recovered->generation.left == std::vector<std::string>{"r1"},
               recovered->generation.ToString());
    e = Step(g, *rep, grads, nullptr);
    RANK_CHECK(e.empty(), e);
    RANK_CHECK(rep->step == 7 && rep->weights[0] == 1.0f + 3.0f + 1.0f, "step ", rep->step,
               " weight ", rep->weights[0]);
    return "";
  });
  for (size_t r = 0; r < out.size(); ++r) EXPECT_EQ(out[r].code, 0) << out[r].message;
}

INSTANTIATE_TEST_SUITE_P(Backends, ElasticBackend, ::testing::Values("gloo", "nccl"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
}  // namespace omni
