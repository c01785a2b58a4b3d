// ElasticGroup over a real FileStore and real Gloo (loopback), replicas as
// threads, on a fake clock that moves whenever every thread waits
// (auto_advance.h); and the state-transfer format.
#include "omni/elastic.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "auto_advance.h"
#include "omni/clock.h"
#include "omni/config.h"
#include "omni/state.h"
#include "omni/store.h"
#include "replica_state.h"
#include "temp_dir.h"

namespace omni {
namespace {

namespace fs = std::filesystem;

using test_util::AutoAdvance;
using test_util::MakeReplica;
using test_util::Replica;
using test_util::TempDir;

TEST(StateTransfer, RoundTripsEveryObject) {
  auto a = MakeReplica(100, 1.5F);
  a->step = 42;
  absl::StatusOr<std::string> bytes = SerializeState(a->state);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto b = MakeReplica(100, 0.0F);
  ASSERT_TRUE(DeserializeState(*bytes, b->state).ok());
  EXPECT_EQ(b->weights, a->weights);
  EXPECT_EQ(b->step, 42);
}

TEST(StateTransfer, RefusesATruncatedBufferWithoutTouchingTheState) {
  auto a = MakeReplica(100, 1.5F);
  absl::StatusOr<std::string> bytes = SerializeState(a->state);
  ASSERT_TRUE(bytes.ok());
  auto b = MakeReplica(100, 7.0F);
  absl::Status st =
      DeserializeState(std::string_view(*bytes).substr(0, bytes->size() - 9), b->state);
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_EQ(b->weights[0], 7.0F);
}

TEST(StateTransfer, RefusesAnotherModelNamingTheKey) {
  auto a = MakeReplica(100, 1.5F);
  absl::StatusOr<std::string> bytes = SerializeState(a->state);
  ASSERT_TRUE(bytes.ok());
  auto b = MakeReplica(64, 7.0F);  // other shapes
  absl::Status st = DeserializeState(*bytes, b->state);
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(absl::StrContains(st.message(), "'w'")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "values")) << st;
  EXPECT_EQ(b->weights[0], 7.0F);
}

#if OMNI_HAVE_GLOO

ElasticOptions Opts(const FakeClock& clock, const std::string& id, int min_replicas,
                    int max_replicas) {
  ElasticOptions o;
  o.membership.clock = &clock;
  o.membership.job_id = "job";
  o.membership.model_digest = "m";
  o.membership.self.id = id;
  o.membership.min_replicas = min_replicas;
  o.membership.max_replicas = max_replicas;
  o.membership.heartbeat = absl::Milliseconds(20);
  o.membership.peer_timeout = absl::Milliseconds(300);
  o.membership.settle = absl::Seconds(2);  // all start together: max_replicas forms it
  o.membership.join_timeout = absl::Seconds(20);
  o.collective_timeout = absl::Seconds(20);  // real time (a backstop)
  o.init_timeout = absl::Seconds(10);
  return o;
}

std::unique_ptr<Store> Open(const TempDir& dir) {
  absl::StatusOr<std::unique_ptr<Store>> s = OpenStore("file://" + dir.path() + "/store");
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

TEST(ElasticGroup, StartHandsTheMostAdvancedStateToEveryReplica) {
  FakeClock clock;
  AutoAdvance advance(clock);
  TempDir dir;
  auto store = Open(dir);
  std::vector<std::unique_ptr<Replica>> reps;
  reps.reserve(3);
  for (int i = 0; i < 3; ++i) reps.push_back(MakeReplica(1000, static_cast<float>(i)));
  reps[1]->step = 9;  // e.g. restored from a newer checkpoint
  std::vector<std::unique_ptr<ElasticGroup>> groups(3);
  std::vector<GroupChange> changes(3);
  std::vector<std::thread> threads;
  threads.reserve(3);
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      auto g =
          ElasticGroup::Create(*store, Opts(clock, "r" + std::to_string(i), 3, 3), reps[i]->state);
      ASSERT_TRUE(g.ok()) << g.status();
      groups[i] = *std::move(g);
      absl::StatusOr<GroupChange> c = groups[i]->Start(reps[i]->step);
      ASSERT_TRUE(c.ok()) << c.status();
      changes[i] = *c;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(reps[i]->step, 9);
    EXPECT_EQ(reps[i]->weights, std::vector<float>(1000, 1.0F));
    EXPECT_EQ(changes[i].completed, 9);
    EXPECT_EQ(changes[i].generation.size(), 3);
  }
  EXPECT_FALSE(changes[1].state_received);
  EXPECT_TRUE(changes[0].state_received);
  EXPECT_GT(changes[0].state_bytes, 4000U);
}

TEST(ElasticGroup, SurvivorsOfALostReplicaRecoverAndKeepReducing) {
  FakeClock clock;
  AutoAdvance advance(clock);
  TempDir dir;
  auto store = Open(dir);
  constexpr int kN = 3;
  std::vector<std::unique_ptr<Replica>> reps;
  reps.reserve(kN);
  for (int i = 0; i < kN; ++i) reps.push_back(MakeReplica(16, 0.0F));
  std::vector<std::unique_ptr<ElasticGroup>> groups(kN);
  {
    std::vector<std::thread> threads;
    threads.reserve(kN);
    for (int i = 0; i < kN; ++i) {
      threads.emplace_back([&, i] {
        auto g = ElasticGroup::Create(*store, Opts(clock, "r" + std::to_string(i), 2, 3),
                                      reps[i]->state);
        ASSERT_TRUE(g.ok()) << g.status();
        groups[i] = *std::move(g);
        absl::StatusOr<GroupChange> c = groups[i]->Start(0);
        ASSERT_TRUE(c.ok()) << c.status();
      });
    }
    for (std::thread& t : threads) t.join();
  }
  // One reduction with all three, then r2 disappears (its heartbeats stop
  // and its connections close) while r0 and r1 wait in the next one.
  std::vector<absl::Status> first(kN), second(2);
  std::vector<float> sums(kN);
  {
    std::vector<std::thread> threads;
    threads.reserve(kN);
    for (int i = 0; i < kN; ++i) {
      threads.emplace_back([&, i] {
        float v = 1.0F;
        first[i] = groups[i]->AllReduce(&v, 1, DType::kF32, ReduceOp::kSum);
        sums[i] = v;
      });
    }
    for (std::thread& t : threads) t.join();
  }
  for (int i = 0; i < kN; ++i) {
    ASSERT_TRUE(first[i].ok()) << first[i];
    EXPECT_EQ(sums[i], 3.0F);
  }
  std::vector<GroupChange> recovered(2);
  std::vector<float> after(2);
  std::vector<std::thread> threads;
  threads.reserve(2);
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      float v = 1.0F;
      absl::Status st = groups[i]->AllReduce(&v, 1, DType::kF32, ReduceOp::kSum);
      second[i] = st;
      ASSERT_FALSE(st.ok());  // r2 never arrives
      absl::StatusOr<GroupChange> c = groups[i]->Recover(st, 1);
      ASSERT_TRUE(c.ok()) << c.status();
      recovered[i] = *c;
      v = 1.0F;
      ASSERT_TRUE(groups[i]->AllReduce(&v, 1, DType::kF32, ReduceOp::kSum).ok());
      after[i] = v;
    });
  }
  // Once the others wait in their reduction (fake time passes only while
  // every thread waits).
  clock.SleepFor(std::chrono::milliseconds(50));
  groups[2].reset();
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(recovered[i].generation.size(), 2);
    EXPECT_EQ(recovered[i].generation.kind, GenerationKind::kRecover);
    EXPECT_EQ(recovered[i].generation.left, std::vector<std::string>{"r2"});
    EXPECT_EQ(after[i], 2.0F);
  }
}

#endif  // OMNI_HAVE_GLOO

}  // namespace
}  // namespace omni
