// Runtime in elastic mode with one checkpoint directory shared by the
// replicas (job-level checkpoints): replicas as threads over a real
// FileStore with real Gloo (loopback), on a fake clock that moves whenever
// every thread waits (auto_advance.h).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "auto_advance.h"
#include "omni/config.h"
#include "omni/runtime.h"
#include "omni/state.h"
#include "omni/stats.h"
#include "omni/step_log.h"
#include "omni/telemetry.h"
#include "temp_dir.h"

namespace omni {
namespace {

using test_util::AutoAdvance;
using test_util::TempDir;

#if OMNI_HAVE_GLOO

struct Log {
  void Add(const std::string& line) {
    absl::MutexLock l(&mu);
    if (std::getenv("RUNTIME_TEST_LOG") != nullptr) std::fprintf(stderr, "log: %s\n", line.c_str());
    lines.push_back(line);
  }
  bool Has(const std::string& what) {
    absl::MutexLock l(&mu);
    for (const std::string& s : lines) {
      if (absl::StrContains(s, what)) return true;
    }
    return false;
  }
  absl::Mutex mu;
  std::vector<std::string> lines;
};

// Replicated weights, and a per-replica counter that feeds the gradient and
// advances by a rank-dependent amount: restoring another replica's counter,
// or none, changes the weights.
struct Trainer {
  std::vector<float> w = std::vector<float>(32, 0.0F);
  int64_t counter[1] = {0};
  BytesState w_state{"w", w.data(), w.size() * sizeof(float)};
  BytesState counter_state{"value", counter, sizeof(counter)};
};

RuntimeOptions Options(const std::string& ckpt_dir, const std::string& store_dir,
                       const Clock* clock, Log* log, const std::string& id, int min_replicas,
                       int max_replicas, bool monitored) {
  RuntimeOptions o;
  o.source = "test";
  o.job_id = "shared-job";
  o.clock = clock;
  o.ckpt_dir = ckpt_dir;
  o.telemetry.forecast_enabled = false;
  o.preemption.signals = {};
  o.preemption.k = 0;
  o.handle_preemption = monitored;
  o.log = [log, id](const std::string& line) { log->Add(id + ": " + line); };
  o.store_uri = "file://" + store_dir;
  MembershipOptions& m = o.elastic.membership;
  m.self.id = id;
  m.model_digest = "m";
  m.min_replicas = min_replicas;
  m.max_replicas = max_replicas;
  m.heartbeat = absl::Milliseconds(20);
  m.peer_timeout = absl::Milliseconds(300);
  m.settle = absl::Seconds(2);
  m.join_timeout = absl::Seconds(20);
  o.elastic.collective_timeout = absl::Seconds(20);
  o.elastic.init_timeout = absl::Seconds(10);
  return o;
}

struct Outcome {
  int64_t start_step = -1;
  int64_t final_step = 0;
  int64_t saved_step = -1;
  std::vector<float> w;
  int64_t counter = 0;
  std::vector<CheckpointInfo> list;
  // The telemetry's saves: the checkpoint phase's, and the abandoned ones'.
  StatsSnapshot::Row save, abandoned;
};

// Trains to `total` or a kSaveAndExit; the monitored replica gets a notice
// after step `notice_at` (a save fits, another step and a save do not). Each
// step computes for `step_time` of fake time (kInstant: computing takes no
// fake time, see auto_advance.h).
constexpr std::chrono::nanoseconds kInstant(0);
void Train(RuntimeOptions o, int64_t total, FakeClock* clock, int64_t notice_at,
           std::chrono::nanoseconds step_time, Outcome* out) {
  Trainer t;
  absl::StatusOr<std::unique_ptr<Runtime>> created = Runtime::Create(std::move(o));
  ASSERT_TRUE(created.ok()) << created.status();
  Runtime& rt = **created;
  ASSERT_TRUE(rt.Register("model", &t.w_state).ok());
  ASSERT_TRUE(rt.Register("counter", &t.counter_state, StateScope::kPerReplica).ok());
  t.counter[0] = int64_t{1000} * (rt.rank() + 1);  // before Start: a restore replaces it
  absl::StatusOr<int64_t> start = rt.Start();
  ASSERT_TRUE(start.ok()) << start.status();
  out->start_step = *start;
  while (rt.step() < total) {
    if (rt.preemption() != nullptr && rt.step() == notice_at) {
      rt.preemption()->Notice(clock->NowNanos() + 60'000'000);
    }
    ASSERT_TRUE(rt.BeginStep().ok());
    if (step_time.count() > 0) clock->SleepFor(step_time);
    float g = static_cast<float>(rt.step() + t.counter[0] % 97);
    if (rt.AllReduce(&g, 1, DType::kF32, ReduceOp::kSum).ok()) {
      for (float& x : t.w) x = x * 0.5F + g;
      t.counter[0] += rt.rank() + 1;
    }
    absl::StatusOr<Decision> d = rt.EndStep();
    ASSERT_TRUE(d.ok()) << d.status();
    if (d->kind == Decision::kSaveAndExit) {
      out->saved_step = d->saved_step;
      break;
    }
  }
  out->final_step = rt.step();
  out->w = t.w;
  out->counter = t.counter[0];
  ASSERT_NE(rt.job_checkpoints(), nullptr);
  EXPECT_EQ(rt.checkpoints(), nullptr);
  absl::StatusOr<std::vector<CheckpointInfo>> list = rt.job_checkpoints()->List();
  ASSERT_TRUE(list.ok()) << list.status();
  out->list = *list;
  ASSERT_TRUE(rt.telemetry().Flush().ok());
  for (const StatsSnapshot::Row& row : rt.telemetry().Snapshot().rows) {
    if (row.name == "checkpoint") out->save = row;
    if (row.name == "save_abandoned") out->abandoned = row;
  }
  EXPECT_TRUE(rt.Finish().ok());
}

// A replica that commits `committed` steps, runs the collective of the next
// one and disappears before its boundary (destroyed: its heartbeats stop
// and its connections close); `before_loss` runs just before.
void TrainThenVanish(const RuntimeOptions& o, int committed,
                     const std::function<void()>& before_loss = {}) {
  Trainer t;
  absl::StatusOr<std::unique_ptr<Runtime>> rt = Runtime::Create(o);
  ASSERT_TRUE(rt.ok()) << rt.status();
  ASSERT_TRUE((*rt)->Register("model", &t.w_state).ok());
  ASSERT_TRUE((*rt)->Register("counter", &t.counter_state, StateScope::kPerReplica).ok());
  ASSERT_TRUE((*rt)->Start().ok());
  for (int s = 0; s <= committed; ++s) {
    ASSERT_TRUE((*rt)->BeginStep().ok());
    float g = static_cast<float>((*rt)->step() + t.counter[0] % 97);
    ASSERT_TRUE((*rt)->AllReduce(&g, 1, DType::kF32, ReduceOp::kSum).ok());
    if (s == committed) break;
    absl::StatusOr<Decision> d = (*rt)->EndStep();
    ASSERT_TRUE(d.ok()) << d.status();
  }
  if (before_loss) before_loss();
}

// Runs `n` replicas r0..r(n-1) as threads; replica `monitored` gets the
// notice; `tweak` (if set) changes replica i's options.
std::vector<Outcome> RunReplicas(const TempDir& dir, const std::string& store, FakeClock* clock,
                                 Log* log, int n, int64_t total, int64_t notice_at,
                                 int monitored = -1, int64_t ckpt_every = 0,
                                 std::chrono::nanoseconds step_time = kInstant,
                                 const std::function<void(int, RuntimeOptions&)>& tweak = {}) {
  std::vector<Outcome> out(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    RuntimeOptions o = Options(dir / "ckpt", dir / store, clock, log, "r" + std::to_string(i), n, n,
                               i == monitored);
    o.ckpt_every = ckpt_every;
    if (tweak) tweak(i, o);
    threads.emplace_back(Train, o, total, clock, notice_at, step_time, &out[i]);
  }
  for (std::thread& t : threads) t.join();
  return out;
}

TEST(RuntimeSharedCheckpoint, TwoReplicasStopIntoOneCheckpointAndResumeBitExactlyAtTwo) {
  constexpr int64_t kTotal = 14;
  FakeClock clock;
  AutoAdvance advance(clock);  // the group waits on it
  Log log;
  TempDir ref_dir;
  const std::vector<Outcome> ref = RunReplicas(ref_dir, "store", &clock, &log, 2, kTotal, -1);
  ASSERT_EQ(ref[0].final_step, kTotal);

  TempDir dir;
  const std::vector<Outcome> stopped = RunReplicas(dir, "store1", &clock, &log, 2, kTotal, 3, 1);
  ASSERT_GT(stopped[0].saved_step, 0);
  EXPECT_EQ(stopped[0].saved_step, stopped[1].saved_step);
  ASSERT_EQ(stopped[0].list.size(), 1U);
  EXPECT_EQ(stopped[0].list[0].step, stopped[0].saved_step);
  EXPECT_EQ(stopped[0].list[0].world_size, 2) << "one checkpoint written by both";
  absl::StatusOr<std::vector<JobPartInfo>> parts = JobCheckpointParts(stopped[0].list[0].path);
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 2U);
  EXPECT_EQ((*parts)[0].replica_id, "r0");
  EXPECT_EQ((*parts)[1].replica_id, "r1");
  // 32 floats and the step counter (8 bytes), split in two.
  EXPECT_EQ((*parts)[0].replicated_bytes + (*parts)[1].replicated_bytes, 32 * 4 + 8);
  EXPECT_LE(std::abs((*parts)[0].replicated_bytes - (*parts)[1].replicated_bytes), 8);

  const std::vector<Outcome> resumed = RunReplicas(dir, "store2", &clock, &log, 2, kTotal, -1);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(resumed[i].start_step, stopped[0].saved_step);
    EXPECT_EQ(resumed[i].final_step, kTotal);
    EXPECT_EQ(resumed[i].w, ref[i].w) << "bit-exact, replica " << i;
    EXPECT_EQ(resumed[i].counter, ref[i].counter) << "per-replica state, replica " << i;
  }
}

TEST(RuntimeSharedCheckpoint, ACheckpointOfTwoReplicasResumesWithOneAndTheStepContinues) {
  constexpr int64_t kTotal = 12;
  FakeClock clock;
  AutoAdvance advance(clock);  // the group waits on it
  Log log;
  TempDir dir;
  const std::vector<Outcome> stopped = RunReplicas(dir, "store1", &clock, &log, 2, kTotal, 3, 0);
  ASSERT_GT(stopped[0].saved_step, 0);
  const std::vector<Outcome> alone = RunReplicas(dir, "store2", &clock, &log, 1, kTotal, -1);
  EXPECT_EQ(alone[0].start_step, stopped[0].saved_step);
  EXPECT_EQ(alone[0].final_step, kTotal);
  EXPECT_TRUE(log.Has("restored the per-replica state of part 0 ('r0')"));
}

TEST(RuntimeSharedCheckpoint, PeriodicCheckpointsFollowTheGroupThroughAJoin) {
  constexpr int64_t kTotal = 400;
  // Steps that take time, so that the third replica is admitted while the
  // others train.
  constexpr std::chrono::milliseconds kStep(5);
  FakeClock clock;
  AutoAdvance advance(clock);  // the group waits on it
  Log log;
  TempDir dir;
  std::vector<Outcome> out(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    RuntimeOptions o =
        Options(dir / "ckpt", dir / "store", &clock, &log, "r" + std::to_string(i), 2, 3, false);
    o.ckpt_every = 10;
    threads.emplace_back(Train, o, kTotal, &clock, -1, kStep, &out[i]);
  }
  // The third replica starts once the first two have a checkpoint: it
  // restores it, joins at a boundary and receives the current state.
  threads.emplace_back([&] {
    const auto saved = [&] {
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(dir / "ckpt", ec)) {
        if (e.path().filename().string().rfind("step-", 0) == 0) return true;
      }
      return false;
    };
    // Waits (bounded) for an event of the other threads, looking again
    // each time they all wait.
    for (int i = 0; i < 4000 && !saved(); ++i) clock.SleepFor(std::chrono::milliseconds(5));
    RuntimeOptions o = Options(dir / "ckpt", dir / "store", &clock, &log, "r2", 2, 3, false);
    o.ckpt_every = 10;
    Train(o, kTotal, &clock, -1, kStep, &out[2]);
  });
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(out[i].final_step, kTotal) << i;
    EXPECT_EQ(out[i].w, out[0].w) << i;
  }
  ASSERT_FALSE(out[0].list.empty());
  EXPECT_EQ(out[0].list[0].world_size, 3) << "the newest checkpoint has a part per replica";
  EXPECT_TRUE(log.Has("(join)"));
}

// Checkpoints by wall time in a group: the replicas' intervals pass at
// different boundaries (here their periods differ: 40 and 70 ms), and a
// job-level save is collective, so they agree on one boundary (the first
// whose interval passed proposes it) and every checkpoint has both parts.
// Each declares its period to the forecaster with that one step's lag.
TEST(RuntimeSharedCheckpoint, ReplicasSaveByWallTimeAtTheBoundaryTheFirstDueOneProposes) {
  constexpr int64_t kTotal = 60;
  constexpr std::chrono::milliseconds kStep(5);
  FakeClock clock;
  AutoAdvance advance(clock);  // the group waits on it
  Log log;
  TempDir dir;
  const std::vector<Outcome> out = RunReplicas(
      dir, "store", &clock, &log, 2, kTotal, -1, -1, 0, kStep, [&dir](int i, RuntimeOptions& o) {
        o.ckpt_every_time = absl::Milliseconds(i == 0 ? 40 : 70);
        o.keep_last = 100;
        o.telemetry.step_log_path = dir / ("steps-" + std::to_string(i) + ".jsonl");
      });
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(out[i].final_step, kTotal) << i;
    absl::StatusOr<StepLog> logged = ReadStepLog(dir / ("steps-" + std::to_string(i) + ".jsonl"));
    ASSERT_TRUE(logged.ok()) << logged.status();
    EXPECT_EQ(logged->header.checkpoint.every_ns, (i == 0 ? 40 : 70) * 1'000'000) << i;
    EXPECT_EQ(logged->header.checkpoint.wall_lag_steps, 1) << i << ": the agreed boundary";
  }
  EXPECT_EQ(out[0].w, out[1].w);
  // About one save every 8-9 steps of 5 ms: the shorter period.
  ASSERT_GE(out[0].list.size(), 4U);
  for (const CheckpointInfo& c : out[0].list) {
    EXPECT_EQ(c.world_size, 2) << "step " << c.step << ": written by both";
    EXPECT_TRUE(VerifyJobCheckpoint(c.path).ok()) << c.path;
  }
  EXPECT_FALSE(log.Has("abandoned"));
}

TEST(RuntimeSharedCheckpoint, AReplicaLostAtASaveBoundaryAbandonsThatSaveAndTheSurvivorsGoOn) {
  constexpr int64_t kTotal = 8;
  FakeClock clock;
  AutoAdvance advance(clock);  // the group waits on it
  Log log;
  TempDir dir;
  std::vector<Outcome> out(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    RuntimeOptions o =
        Options(dir / "ckpt", dir / "store", &clock, &log, "r" + std::to_string(i), 1, 3, false);
    o.ckpt_every = 1;
    o.telemetry.stats.warmup.min_steps = 0;  // every save in the statistics
    o.telemetry.stats.warmup.max_steps = 0;
    threads.emplace_back(Train, o, kTotal, &clock, -1, kInstant, &out[i]);
  }
  // A third replica that disappears after two steps (and two saves), between
  // the collective of its third step and that step's save.
  {
    RuntimeOptions o = Options(dir / "ckpt", dir / "store", &clock, &log, "r2", 1, 3, false);
    o.ckpt_every = 1;
    TrainThenVanish(o, 2);
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 2; ++i) EXPECT_EQ(out[i].final_step, kTotal) << i;
  EXPECT_EQ(out[0].w, out[1].w);
  ASSERT_FALSE(out[0].list.empty());
  EXPECT_EQ(out[0].list[0].step, kTotal);
  EXPECT_EQ(out[0].list[0].world_size, 2) << "the survivors save together";
  for (const CheckpointInfo& c : out[0].list) EXPECT_TRUE(VerifyJobCheckpoint(c.path).ok());
  EXPECT_TRUE(log.Has("checkpoint of step 3 abandoned")) << "the save boundary saw the loss";
  // The abandoned save's time (until the loss was seen) is host-side time
  // in the telemetry, not a save's: the save bound learns from saves only.
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(out[i].abandoned.summary.count, 1) << i;
    EXPECT_EQ(out[i].abandoned.idle_kind, "host_side") << i;
    EXPECT_EQ(out[i].save.summary.count, kTotal - 1) << i << ": the saves of steps 1-2 and 4-8";
  }
}

// Every replica that held the newest state is gone, and none was restarted
// (a restarted one restores the newest checkpoint and brings it): the
// survivors' new generation holds older state than the newest job-level
// checkpoint. They catch up with it rather than train its steps again, and
// end as a job resumed from it ends.
TEST(RuntimeSharedCheckpoint, SurvivorsOlderThanTheNewestCheckpointCatchUpWithIt) {
  constexpr int64_t kTotal = 40;
  FakeClock clock;
  AutoAdvance advance(clock);  // the group waits on it
  Log log;
  // The newer state: r0 and r1 stopped with a save after step 20; and the
  // reference, the two resumed from that checkpoint.
  TempDir earlier;
  const std::vector<Outcome> stopped =
      RunReplicas(earlier, "store", &clock, &log, 2, kTotal, 20, 1);
  const int64_t saved = stopped[0].saved_step;
  ASSERT_GT(saved, 3);
  TempDir ref;
  std::filesystem::copy(earlier / "ckpt", ref / "ckpt", std::filesystem::copy_options::recursive);
  const std::vector<Outcome> resumed = RunReplicas(ref, "store", &clock, &log, 2, kTotal, -1);
  ASSERT_EQ(resumed[0].start_step, saved);

  // The job: r0, r1 and r2 from step 0, nothing saved. During r2's third
  // step the checkpoint appears in the shared directory (written, as it
  // were, by replicas since lost), and r2 is lost.
  TempDir dir;
  std::vector<Outcome> out(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    RuntimeOptions o =
        Options(dir / "ckpt", dir / "store", &clock, &log, "r" + std::to_string(i), 1, 3, false);
    threads.emplace_back(Train, o, kTotal, &clock, -1, kInstant, &out[i]);
  }
  TrainThenVanish(Options(dir / "ckpt", dir / "store", &clock, &log, "r2", 1, 3, false), 2, [&] {
    const std::filesystem::path to(dir / "ckpt");
    for (const auto& e : std::filesystem::directory_iterator(earlier / "ckpt")) {
      const std::string name = e.path().filename().string();
      if (name.rfind("step-", 0) != 0) continue;
      std::filesystem::copy(e.path(), to / (".incoming-" + name),
                            std::filesystem::copy_options::recursive);
      std::filesystem::rename(to / (".incoming-" + name), to / name);
    }
  });
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(log.Has("caught up with the checkpoint of step " + std::to_string(saved)));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(out[i].final_step, kTotal) << i;
    EXPECT_EQ(out[i].w, resumed[0].w) << "replica " << i << " ends as the resumed job";
    EXPECT_EQ(out[i].counter, resumed[i].counter) << "replica " << i << "'s own state";
  }
}

#endif  // OMNI_HAVE_GLOO

}  // namespace
}  // namespace omni
