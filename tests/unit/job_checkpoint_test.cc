// JobCheckpointManager: replicas as threads sharing one directory.
#include "omni/job_checkpoint.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdint>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "ckpt/job_checkpoint_fs.h"
#include "omni/state.h"
#include "pass_through_fs.h"
#include "temp_dir.h"

namespace omni {
namespace {

using test_util::TempDir;
namespace fs = std::filesystem;

// Replicated state: tensors of several dtypes and sizes (one large one, a
// blob of odd length, an empty one), the same on every replica; per-replica
// state: a counter of its own.
struct Replica {
  explicit Replica(int id, uint32_t seed = 1)
      : big(10'007),
        small(13),
        blob(1'001),
        rng{static_cast<uint64_t>(1000 + id)},
        big_state("w", big.data(), big.size() * sizeof(float)),
        small_state("b", small.data(), small.size() * sizeof(double)),
        blob_state("blob", blob.data(), blob.size()),
        rng_state("state", rng, sizeof(rng)) {
    uint32_t x = seed;
    for (float& v : big) v = static_cast<float>((x = x * 1664525U + 1013904223U) % 1000);
    for (double& v : small) v = static_cast<double>((x = x * 1664525U + 1013904223U) % 77);
    for (char& c : blob) c = static_cast<char>((x = x * 1664525U + 1013904223U) >> 24);
    EXPECT_TRUE(replicated.Register("model", &big_state).ok());
    EXPECT_TRUE(replicated.Register("optim", &small_state).ok());
    EXPECT_TRUE(replicated.Register("data", &blob_state).ok());
    EXPECT_TRUE(replicated.Register("empty", &empty_state).ok());
    EXPECT_TRUE(per_replica.Register("rng", &rng_state).ok());
  }
  Replica(const Replica&) = delete;  // the registries point into it
  Replica& operator=(const Replica&) = delete;
  struct Empty final : Stateful {
    absl::Status Save(StateWriter& w) const override {
      return w.PutTensor("none", DType::kF32, {0, 4}, nullptr, 0);
    }
    absl::Status Load(const StateReader& r) override { return r.Find("none").status(); }
  };
  std::vector<float> big;
  std::vector<double> small;
  std::vector<char> blob;
  uint64_t rng[1];
  BytesState big_state, small_state, blob_state, rng_state;
  Empty empty_state;
  StateRegistry replicated, per_replica;
};

JobCheckpointOptions Options(const std::string& dir, const std::string& id) {
  JobCheckpointOptions o;
  o.dir = dir;
  o.job_id = "job-a";
  o.replica_id = id;
  o.part_timeout = absl::Seconds(20);
  return o;
}

std::unique_ptr<JobCheckpointManager> MustOpen(const JobCheckpointOptions& o) {
  absl::StatusOr<std::unique_ptr<JobCheckpointManager>> m = JobCheckpointManager::Open(o);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

// Saves `step` with `n` replicas as threads; returns each one's result.
std::vector<absl::StatusOr<JobSaveStats>> SaveTogether(const std::string& dir, int64_t step,
                                                       std::deque<Replica>& reps, uint64_t token) {
  const int n = static_cast<int>(reps.size());
  std::vector<absl::StatusOr<JobSaveStats>> out(n, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<JobCheckpointManager> m = MustOpen(Options(dir, "r" + std::to_string(r)));
      if (m == nullptr) return;
      JobSaveGroup g;
      g.rank = r;
      g.size = n;
      g.token = token;
      out[r] = m->Save(step, g, reps[r].replicated, reps[r].per_replica, {{"k", "v"}});
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

constexpr int64_t kReplicatedBytes = 10'007 * 4 + 13 * 8 + 1'001;

TEST(JobCheckpoint, ReplicasSharingADirectoryEachWriteAboutAnNthOfTheReplicatedState) {
  TempDir dir;
  for (int n : {1, 2, 3}) {
    std::deque<Replica> reps;
    for (int r = 0; r < n; ++r) reps.emplace_back(r);
    const int64_t step = 10 + n;
    for (const auto& st : SaveTogether(dir.path(), step, reps, 77 + n)) {
      ASSERT_TRUE(st.ok()) << st.status();
    }
    absl::StatusOr<std::vector<JobPartInfo>> parts =
        JobCheckpointParts(dir / ("step-0000000000" + std::to_string(step)));
    ASSERT_TRUE(parts.ok()) << parts.status();
    ASSERT_EQ(parts->size(), static_cast<size_t>(n));
    int64_t sum = 0;
    for (const JobPartInfo& p : *parts) {
      sum += p.replicated_bytes;
      // Cuts fall on element boundaries: within one element (8 bytes) of T/n.
      EXPECT_LE(std::abs(p.replicated_bytes - kReplicatedBytes / n), 8) << n << " " << p.rank;
      EXPECT_EQ(p.replica_bytes, 8);
      EXPECT_EQ(p.replica_id, "r" + std::to_string(p.rank));
    }
    EXPECT_EQ(sum, kReplicatedBytes) << "replicated state written exactly once";
  }
}

TEST(JobCheckpoint, RestoreAtAnyReplicaCountLoadsTheReplicatedStateFromEveryPart) {
  TempDir dir;
  std::deque<Replica> reps;
  for (int r = 0; r < 3; ++r) reps.emplace_back(r, 5);
  for (const auto& st : SaveTogether(dir.path(), 7, reps, 99)) ASSERT_TRUE(st.ok()) << st.status();
  for (int readers : {1, 2, 4}) {
    for (int r = 0; r < readers; ++r) {
      Replica fresh(50 + r, 6);  // other values
      std::unique_ptr<JobCheckpointManager> m = MustOpen(Options(dir.path(), "x"));
      absl::StatusOr<CheckpointManager::RestoreResult> res = m->RestoreReplicated(fresh.replicated);
      ASSERT_TRUE(res.ok()) << res.status();
      EXPECT_EQ(res->info.step, 7);
      EXPECT_EQ(res->info.world_size, 3);
      EXPECT_EQ(fresh.big, reps[0].big);
      EXPECT_EQ(fresh.small, reps[0].small);
      EXPECT_EQ(fresh.blob, reps[0].blob);
      if (r < 3) {
        ASSERT_TRUE(m->RestorePerReplica(fresh.per_replica, 7, r).ok());
        EXPECT_EQ(fresh.rng[0], reps[r].rng[0]);
      } else {
        EXPECT_TRUE(absl::IsNotFound(m->RestorePerReplica(fresh.per_replica, 7, r)));
      }
    }
  }
  EXPECT_TRUE(VerifyJobCheckpoint(dir / "step-000000000007").ok());
}

// The first replica to open a directory removes what crashed saves left;
// this file system runs `during_cleanup` when that removal lists the
// directory.
class CleanupHook final : public testing::PassThroughFileSystem {
 public:
  CleanupHook(std::string dir, std::function<void()> during_cleanup)
      : dir_(std::move(dir)), during_cleanup_(std::move(during_cleanup)) {}
  absl::StatusOr<std::vector<internal::DirEntry>> List(int dir, const std::string& path) override {
    if (path == dir_ && during_cleanup_) std::exchange(during_cleanup_, nullptr)();
    return PassThroughFileSystem::List(dir, path);
  }

 private:
  const std::string dir_;
  std::function<void()> during_cleanup_;
};

TEST(JobCheckpoint, NoReplicaJoinsWhileTheFirstRemovesWhatCrashedSavesLeft) {
  // The first replica to open removed the crashed saves' directories after
  // letting others join: a replica that joined at once and began its save
  // had its part removed with them, and the save gave up after 20 s (three
  // replicas opening and saving together as threads, once in a loaded
  // `make test`; 600 runs alone did not show it). A replica joins
  // by taking the lock's guard, so the guard must be held through the
  // removal.
  TempDir dir;
  fs::create_directories(dir / ".tmp-step-000000000003");  // a crashed save's
  const std::string joined_part = (dir / ".tmp-step-000000000007") + "/part-000001.safetensors";
  bool guard_free = false, joined_save_kept = true;
  CleanupHook hook(dir.path(), [&] {
    // What a replica joining now does first: take the guard.
    const int g = ::open((dir / ".lock-job-guard").c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(g, 0);
    guard_free = ::flock(g, LOCK_EX | LOCK_NB) == 0;
    if (guard_free) {  // it joins and begins a save: its part is written
      fs::create_directories(dir / ".tmp-step-000000000007");
      std::ofstream(joined_part) << "x";
      ::flock(g, LOCK_UN);
    }
    ::close(g);
  });
  auto first = internal::OpenJobCheckpointManagerOn(Options(dir.path(), "r0"), hook);
  ASSERT_TRUE(first.ok()) << first.status();
  if (guard_free) {
    joined_save_kept = fs::exists(joined_part);
  }
  EXPECT_FALSE(guard_free) << "a replica could join while the crashed saves were removed";
  EXPECT_TRUE(joined_save_kept) << "the save of a replica that joined was removed";
  EXPECT_FALSE(fs::exists(dir / ".tmp-step-000000000003")) << "the crashed save's is removed";
}

TEST(JobCheckpoint, AReplicaThatNeverWritesItsPartLeavesThePreviousCheckpointTheNewestValid) {
  TempDir dir;
  std::deque<Replica> reps;
  for (int r = 0; r < 2; ++r) reps.emplace_back(r);
  for (const auto& st : SaveTogether(dir.path(), 1, reps, 1)) ASSERT_TRUE(st.ok()) << st.status();
  // Step 2: replica 1 "dies" before writing; rank 0 learns it from `check`.
  std::unique_ptr<JobCheckpointManager> m = MustOpen(Options(dir.path(), "r0"));
  JobSaveGroup g;
  g.rank = 0;
  g.size = 2;
  g.token = 2;
  int polls = 0;
  g.check = [&polls]() {
    return ++polls < 5 ? absl::OkStatus() : absl::AbortedError("replica r1 died");
  };
  absl::StatusOr<JobSaveStats> st = m->Save(2, g, reps[0].replicated, reps[0].per_replica, {});
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(absl::StrContains(st.status().message(), "r1 died")) << st.status();
  absl::StatusOr<std::vector<CheckpointInfo>> list = m->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1U);
  EXPECT_EQ((*list)[0].step, 1);
  EXPECT_FALSE(std::filesystem::exists(dir / "step-000000000002"));
  // The other way round: rank 0 dies after replica 1 wrote its part.
  g.rank = 1;
  g.token = 3;
  polls = 0;
  st = m->Save(2, g, reps[1].replicated, reps[1].per_replica, {});
  ASSERT_FALSE(st.ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "step-000000000002"));
  Replica fresh(9, 4);
  absl::StatusOr<CheckpointManager::RestoreResult> res = m->RestoreReplicated(fresh.replicated);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->info.step, 1);
  // A later save at the same step, with both, commits (the leftovers of the
  // failed attempts are not taken in).
  for (const auto& s : SaveTogether(dir.path(), 2, reps, 4)) ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(VerifyJobCheckpoint(dir / "step-000000000002").ok());
}

// Replica r1's save of step 2 through `fs`, after both replicas saved step
// 1 in `dir`: the save is abandoned (Aborted, naming the removal), and step
// 1 stays the newest checkpoint.
void ExpectR1sSaveOfStep2Abandoned(const std::string& dir, std::deque<Replica>& reps,
                                   internal::FileSystem& fs) {
  auto m = internal::OpenJobCheckpointManagerOn(Options(dir, "r1"), fs);
  ASSERT_TRUE(m.ok()) << m.status();
  JobSaveGroup g;
  g.rank = 1;
  g.size = 2;
  g.token = 2;
  absl::StatusOr<JobSaveStats> st = (*m)->Save(2, g, reps[1].replicated, reps[1].per_replica, {});
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(absl::IsAborted(st.status())) << st.status();
  EXPECT_TRUE(absl::StrContains(st.status().message(), "was removed")) << st.status();
  absl::StatusOr<std::vector<CheckpointInfo>> list = (*m)->List();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1U);
  EXPECT_EQ((*list)[0].step, 1) << "the checkpoint before stays the newest";
}

// Removes the save's directory when the part file is opened for writing:
// what a replica frozen during a save finds when it thaws after the others
// gave that save up and a later one removed its directory.
class RemoveBeforePart final : public testing::PassThroughFileSystem {
 public:
  RemoveBeforePart(std::string save_dir, std::string part)
      : save_dir_(std::move(save_dir)), part_(std::move(part)) {}
  absl::StatusOr<internal::Fd> OpenWrite(int dir, const std::string& name, bool truncate,
                                         bool exclusive, const std::string& path) override {
    if (name == part_) fs::remove_all(save_dir_);
    return PassThroughFileSystem::OpenWrite(dir, name, truncate, exclusive, path);
  }

 private:
  const std::string save_dir_, part_;
};

TEST(JobCheckpoint, AReplicaWhoseSaveDirectoryWasRemovedMeanwhileAbandonsTheSave) {
  // An omni_train replica frozen (SIGSTOP) during the save of step 20 was
  // thawed after the others had gone on and saved step 25, which removed
  // the older save's directory: its part could not be created (NotFound),
  // and the replica exited 1 instead of going on without that save.
  TempDir dir;
  std::deque<Replica> reps;
  for (int r = 0; r < 2; ++r) reps.emplace_back(r);
  for (const auto& st : SaveTogether(dir.path(), 1, reps, 1)) ASSERT_TRUE(st.ok()) << st.status();
  RemoveBeforePart hook(dir / ".tmp-step-000000000002", "part-00001.safetensors");
  ExpectR1sSaveOfStep2Abandoned(dir.path(), reps, hook);
  EXPECT_FALSE(fs::exists(dir / ".tmp-step-000000000002"));
}

// Removes the save's directory when it is opened, after the save made it:
// a replica frozen between the two (the others' later save removed it).
class RemoveBeforeOpenDir final : public testing::PassThroughFileSystem {
 public:
  explicit RemoveBeforeOpenDir(std::string save_dir) : save_dir_(std::move(save_dir)) {}
  absl::StatusOr<internal::Fd> OpenDir(int dir, const std::string& name,
                                       const std::string& path) override {
    if (path == save_dir_) fs::remove_all(save_dir_);
    return PassThroughFileSystem::OpenDir(dir, name, path);
  }

 private:
  const std::string save_dir_;
};

TEST(JobCheckpoint, AReplicaWhoseSaveDirectoryWasRemovedRightAfterItMadeItAbandonsTheSave) {
  // test_elastic's frozen replicas, under make test's load: r1 was frozen
  // between making the directory of step 20's save and opening it, and
  // exited 1 ("NOT_FOUND: ... open directory .tmp-step-000000000020")
  // instead of going on without that save.
  TempDir dir;
  std::deque<Replica> reps;
  for (int r = 0; r < 2; ++r) reps.emplace_back(r);
  for (const auto& st : SaveTogether(dir.path(), 1, reps, 1)) ASSERT_TRUE(st.ok()) << st.status();
  RemoveBeforeOpenDir hook(dir / ".tmp-step-000000000002");
  ExpectR1sSaveOfStep2Abandoned(dir.path(), reps, hook);
}

TEST(JobCheckpoint, AReplicaWhoseReplicatedStateDiffersInShapeIsRefusedNamingIt) {
  TempDir dir;
  std::deque<Replica> reps;
  reps.emplace_back(0);
  reps.emplace_back(1);
  Replica::Empty extra;
  ASSERT_TRUE(reps[1].replicated.Register("extra", &extra).ok());
  const auto out = SaveTogether(dir.path(), 3, reps, 5);
  ASSERT_FALSE(out[0].ok());
  EXPECT_TRUE(absl::StrContains(out[0].status().message(), "'r1'")) << out[0].status();
  EXPECT_FALSE(out[1].ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "step-000000000003"));
}

TEST(JobCheckpoint, TheJobsReplicasShareTheDirectoryAndAnotherJobIsRefusedNamingBoth) {
  TempDir dir;
  std::unique_ptr<JobCheckpointManager> a = MustOpen(Options(dir.path(), "r0"));
  std::unique_ptr<JobCheckpointManager> b = MustOpen(Options(dir.path(), "r1"));
  JobCheckpointOptions other = Options(dir.path(), "q0");
  other.job_id = "job-b";
  absl::StatusOr<std::unique_ptr<JobCheckpointManager>> c = JobCheckpointManager::Open(other);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(c.status().message(), "job-a")) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), "job-b")) << c.status();
  a.reset();
  b.reset();
  EXPECT_TRUE(JobCheckpointManager::Open(other).ok()) << "free once the job's replicas are gone";
}

TEST(JobCheckpoint, ACorruptPartMakesRestoreFallBackToThePreviousCheckpointNamingTheFile) {
  TempDir dir;
  std::deque<Replica> reps;
  for (int r = 0; r < 2; ++r) reps.emplace_back(r, 11);
  for (const auto& st : SaveTogether(dir.path(), 1, reps, 1)) ASSERT_TRUE(st.ok());
  const std::vector<float> at1 = reps[0].big;
  for (Replica& r : reps) r.big[5000] += 1;
  for (const auto& st : SaveTogether(dir.path(), 2, reps, 2)) ASSERT_TRUE(st.ok());
  const std::string part = dir / "step-000000000002/part-00001.safetensors";
  {
    std::fstream f(part, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  absl::Status v = VerifyJobCheckpoint(dir / "step-000000000002");
  EXPECT_EQ(v.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(v.message(), "part-00001.safetensors")) << v;
  Replica fresh(0, 3);
  std::unique_ptr<JobCheckpointManager> m = MustOpen(Options(dir.path(), "r0"));
  absl::StatusOr<CheckpointManager::RestoreResult> res = m->RestoreReplicated(fresh.replicated);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->info.step, 1);
  ASSERT_EQ(res->skipped.size(), 1U);
  EXPECT_TRUE(absl::StrContains(res->skipped[0], "part-00001.safetensors")) << res->skipped[0];
  EXPECT_EQ(fresh.big, at1);
}

TEST(JobCheckpoint, SaveAloneWritesOnePartAndKeepsAnExistingCheckpointOfTheStep) {
  TempDir dir;
  std::deque<Replica> reps;
  for (int r = 0; r < 2; ++r) reps.emplace_back(r);
  std::unique_ptr<JobCheckpointManager> m = MustOpen(Options(dir.path(), "r1"));
  absl::StatusOr<JobSaveStats> st = m->SaveAlone(4, reps[1].replicated, reps[1].per_replica, {});
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_TRUE(st->solo);
  EXPECT_EQ(st->replicated_bytes, kReplicatedBytes);
  st = m->SaveAlone(4, reps[0].replicated, reps[0].per_replica, {});
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_TRUE(st->kept_existing);
  absl::StatusOr<std::vector<JobPartInfo>> parts = m->Parts(4);
  ASSERT_TRUE(parts.ok());
  ASSERT_EQ(parts->size(), 1U);
  EXPECT_EQ((*parts)[0].replica_id, "r1");
}

TEST(JobCheckpoint, AManifestStepBeyondInt64IsRefusedNamingTheStepNotReadAsNegative) {
  TempDir dir;
  std::deque<Replica> reps;
  reps.emplace_back(0);
  for (const auto& st : SaveTogether(dir.path(), 5, reps, 5)) ASSERT_TRUE(st.ok());
  const std::string manifest = dir / "step-000000000005/manifest.json";
  std::string text;
  {
    std::ifstream in(manifest);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string was = "\"step\": 5,";
  const size_t at = text.find(was);
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, was.size(), "\"step\": 18446744073709551615,");  // 2^64 - 1
  std::ofstream(manifest, std::ios::trunc) << text;
  // Read as int64 it was step -1 ("does not match the directory name");
  // now the manifest is refused for what it holds.
  absl::Status v = VerifyJobCheckpoint(dir / "step-000000000005");
  EXPECT_EQ(v.code(), absl::StatusCode::kDataLoss) << v;
  EXPECT_TRUE(absl::StrContains(v.message(), "no valid step")) << v;
  EXPECT_TRUE(absl::StrContains(v.message(), "manifest.json")) << v;
}

TEST(JobCheckpoint, DescribeNamesEveryReplicaItsShareAndEachPiece) {
  TempDir dir;
  std::deque<Replica> reps;
  for (int r = 0; r < 2; ++r) reps.emplace_back(r);
  for (const auto& st : SaveTogether(dir.path(), 5, reps, 5)) ASSERT_TRUE(st.ok());
  absl::StatusOr<std::string> text = DescribeJobCheckpoint(dir / "step-000000000005");
  ASSERT_TRUE(text.ok()) << text.status();
  for (const char* want : {"job-level", "replicas    2", "rank 0  r0", "rank 1  r1", "model/w",
                           "part 0 [0,", "part 1 [", "per replica, part 1", "rng/state"}) {
    EXPECT_TRUE(absl::StrContains(*text, want)) << want << "\n" << *text;
  }
  EXPECT_TRUE(IsJobCheckpoint(dir / "step-000000000005"));
  absl::StatusOr<std::vector<CheckpointStatus>> scan = ScanJobCheckpoints(dir.path());
  ASSERT_TRUE(scan.ok());
  ASSERT_EQ(scan->size(), 1U);
  EXPECT_TRUE((*scan)[0].status.ok()) << (*scan)[0].status;
}

}  // namespace
}  // namespace omni
