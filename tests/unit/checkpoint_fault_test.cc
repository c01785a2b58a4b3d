// Every operation of a save, failed or crashed at: the previous checkpoint is
// always valid afterwards, the new one valid or absent, and a save that
// returned OK survives the crash (tests/unit/fault_fs.h).
#include <fcntl.h>
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt/checkpoint_fs.h"
#include "fault_fs.h"
#include "omni/checkpoint.h"
#include "omni/state.h"
#include "pass_through_fs.h"
#include "temp_dir.h"

namespace omni {
namespace {

namespace fs = std::filesystem;
using testing::FaultFileSystem;

using test_util::TempDir;

std::string StepDir(const std::string& root, int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%012lld", static_cast<long long>(step));
  return (fs::path(root) / buf).string();
}

// Two tensors, one large enough to be written apart from the stage.
struct TestState {
  TestState() : small("s", a.data(), sizeof(float) * a.size()), large("l", b.data(), b.size() * 4) {
    EXPECT_TRUE(registry.Register("small", &small).ok());
    EXPECT_TRUE(registry.Register("large", &large).ok());
  }
  void Set(int64_t s) {
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(s) + 0.25f * i;
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(s * 7) + 0.5f * i;
  }
  bool Is(int64_t s) const {
    TestState want;
    want.Set(s);
    return a == want.a && b == want.b;
  }
  std::array<float, 16> a{};
  std::vector<float> b = std::vector<float>(size_t{1} << 18);  // 1 MiB
  BytesState small;
  BytesState large;
  StateRegistry registry;
};

CheckpointOptions Options(const std::string& dir) {
  CheckpointOptions o;
  o.dir = dir;
  o.job_id = "job";
  o.keep_last = 2;     // saving 3 drops 1: retention's operations are enumerated too
  o.direct_io = true;  // off by default; its switching is enumerated too
  return o;
}

// True when the checkpoint of `step` is valid (every checksum) and restores
// exactly that step's state.
::testing::AssertionResult Restores(const std::string& dir, int64_t step) {
  if (absl::Status st = VerifyCheckpoint(StepDir(dir, step)); !st.ok()) {
    return ::testing::AssertionFailure() << "step " << step << ": " << st;
  }
  CheckpointOptions o = Options(dir);
  o.keep_last = 100;
  auto m = CheckpointManager::Open(o);
  if (!m.ok()) return ::testing::AssertionFailure() << m.status();
  TestState s;
  auto r = (*m)->Restore(s.registry, step);
  if (!r.ok()) return ::testing::AssertionFailure() << r.status();
  if (!s.Is(step)) return ::testing::AssertionFailure() << "step " << step << ": other values";
  return ::testing::AssertionSuccess();
}

struct Outcome {
  int64_t ops = 0;
  bool fired = false;
  bool saved = false;
};

// Direct I/O in 64 KiB blocks, three in flight: the 1 MiB tensor takes 16
// direct writes from three threads (the default 8 MiB blocks leave a state
// this small to the buffered tail).
ckpt::DirectIoOptions SmallBlocks() {
  ckpt::DirectIoOptions d;
  d.block_bytes = size_t{64} << 10;
  d.depth = 3;
  return d;
}

// Steps 1 and 2 saved normally, then step 3 through the faulty file system.
Outcome SaveUnderFault(const std::string& root, FaultFileSystem::Mode mode, int64_t at, int err,
                       const ckpt::DirectIoOptions& direct = ckpt::DirectIoOptions()) {
  const std::string dir = root + "/ckpt";
  const std::string stash = root + "/stash";
  fs::create_directories(stash);
  {
    auto m = CheckpointManager::Open(Options(dir));
    EXPECT_TRUE(m.ok()) << m.status();
    TestState s;
    for (int64_t step : {1, 2}) {
      s.Set(step);
      EXPECT_TRUE((*m)->Save(step, s.registry, {}).ok());
    }
  }
  FaultFileSystem ffs(stash);
  Outcome out;
  {
    auto m = internal::OpenCheckpointManagerOn(Options(dir), ffs, direct);
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return out;
    ffs.Arm(mode, at, err);
    TestState s;
    s.Set(3);
    out.saved = (*m)->Save(3, s.registry, {}).ok();
  }  // joins the background deletions
  out.ops = ffs.ops();
  out.fired = ffs.fired();
  if (mode == FaultFileSystem::Mode::kCrash) ffs.SimulateCrash(dir);
  return out;
}

void CheckAfter(const std::string& root, const Outcome& o, const std::string& what) {
  const std::string dir = root + "/ckpt";
  SCOPED_TRACE(what);
  EXPECT_TRUE(Restores(dir, 2));
  if (fs::exists(StepDir(dir, 3)) || o.saved) {
    EXPECT_TRUE(Restores(dir, 3));
  }
  if (fs::exists(StepDir(dir, 1))) {
    EXPECT_TRUE(Restores(dir, 1));
  }
  // And the job goes on: the directory opens, the next save commits.
  auto m = CheckpointManager::Open(Options(dir));
  ASSERT_TRUE(m.ok()) << m.status();
  TestState s;
  s.Set(4);
  auto saved = (*m)->Save(4, s.registry, {});
  ASSERT_TRUE(saved.ok()) << saved.status();
  TestState back;
  auto r = (*m)->Restore(back.registry);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->info.step, 4);
  EXPECT_TRUE(back.Is(4));
}

int64_t CountOps(const ckpt::DirectIoOptions& direct = ckpt::DirectIoOptions()) {
  TempDir root;
  const Outcome o = SaveUnderFault(root.path(), FaultFileSystem::Mode::kNone, -1, 0, direct);
  EXPECT_TRUE(o.saved);
  CheckAfter(root.path(), o, "no fault");
  return o.ops;
}

void FailEveryOperation(const ckpt::DirectIoOptions& direct) {
  const int64_t n = CountOps(direct);
  ASSERT_GT(n, 10);
  for (int err : {EIO, ENOSPC}) {
    for (int64_t at = 0; at < n + 2; ++at) {
      TempDir root;
      const Outcome o = SaveUnderFault(root.path(), FaultFileSystem::Mode::kFail, at, err, direct);
      CheckAfter(root.path(), o, absl::StrCat("errno ", err, " at operation ", at, " of ", n));
    }
  }
}

void CrashAtEveryOperation(const ckpt::DirectIoOptions& direct) {
  const int64_t n = CountOps(direct);
  ASSERT_GT(n, 10);
  int saved_then_crashed = 0;
  for (int64_t at = 0; at < n + 2; ++at) {
    TempDir root;
    const Outcome o = SaveUnderFault(root.path(), FaultFileSystem::Mode::kCrash, at, EIO, direct);
    if (o.saved && o.fired) ++saved_then_crashed;
    CheckAfter(root.path(), o, absl::StrCat("crash at operation ", at, " of ", n));
  }
  // Crashes after the commit (during retention) were among them.
  EXPECT_GT(saved_then_crashed, 0);
}

// The seam tells an open directory that was removed meanwhile (links 0)
// from a new one made under its name: a save held up while the others gave
// it up (job_checkpoint.cc) asks it so.
TEST(FileSystemSeam, StatOfAnOpenDirectoryTellsItWasRemovedEvenWhenItsNameIsMadeAgain) {
  TempDir dir;
  internal::FileSystem& real = internal::RealFileSystem();
  const std::string path = dir / "held";
  ASSERT_TRUE(real.Mkdir(AT_FDCWD, path, path).ok());
  absl::StatusOr<internal::Fd> held = real.OpenDir(AT_FDCWD, path, path);
  ASSERT_TRUE(held.ok()) << held.status();
  absl::StatusOr<internal::FileStat> st = real.Stat(held->get(), "", path);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->type, internal::FileType::kDirectory);
  EXPECT_GE(st->links, 2U);
  ASSERT_TRUE(real.Remove(AT_FDCWD, path, /*directory=*/true, path).ok());
  ASSERT_TRUE(real.Mkdir(AT_FDCWD, path, path).ok());  // the name, made again
  st = real.Stat(held->get(), "", path);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->links, 0U);
  EXPECT_GE(real.Stat(AT_FDCWD, path, path)->links, 2U);
}

TEST(CheckpointFaults, EveryOperationOfASaveFailingWithEioOrEnospcKeepsEveryCheckpoint) {
  FailEveryOperation(ckpt::DirectIoOptions());
}

TEST(CheckpointFaults, ACrashAtEveryOperationOfASaveKeepsThePreviousAndLosesNothingCommitted) {
  CrashAtEveryOperation(ckpt::DirectIoOptions());
}

// The same with the shard's bulk written by several direct-I/O threads:
// every one of their writes fails or crashes in turn.
TEST(CheckpointFaults, EveryOperationOfADirectIoSaveFailingKeepsEveryCheckpoint) {
  const int64_t buffered = CountOps(ckpt::DirectIoOptions());
  const int64_t direct = CountOps(SmallBlocks());
  EXPECT_GE(direct, buffered + 15);  // the 16 block writes are operations of their own
  FailEveryOperation(SmallBlocks());
}

TEST(CheckpointFaults, ACrashAtEveryOperationOfADirectIoSaveKeepsThePrevious) {
  CrashAtEveryOperation(SmallBlocks());
}

TEST(CheckpointFaults, ASaveWithoutDirectIoIsTheSameFile) {
  TempDir root;
  TestState s;
  s.Set(5);
  std::string shard[2];
  for (bool direct : {true, false}) {
    CheckpointOptions o = Options(root / (direct ? "direct" : "buffered"));
    o.direct_io = direct;
    auto m = internal::OpenCheckpointManagerOn(o, internal::RealFileSystem(), SmallBlocks());
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE((*m)->Save(5, s.registry, {}).ok());
    m->reset();  // releases the lock for Restores
    std::ifstream in(StepDir(o.dir, 5) + "/rank-00000.safetensors", std::ios::binary);
    shard[direct ? 0 : 1].assign(std::istreambuf_iterator<char>(in), {});
    EXPECT_TRUE(Restores(o.dir, 5));
  }
  ASSERT_GT(shard[0].size(), size_t{1} << 20);
  // Equal but for the random save_id in the header's metadata and the
  // header's padding (the direct data section starts 4096-aligned).
  const auto data = [](const std::string& f) {
    uint64_t n = 0;
    std::memcpy(&n, f.data(), 8);
    return f.substr(8 + n);
  };
  EXPECT_EQ(data(shard[0]), data(shard[1]));
}

// The model itself: what was not fsynced is lost.
TEST(CheckpointFaults, TheFaultFileSystemLosesWhatWasNotSynced) {
  TempDir root;
  const std::string stash = root.path() + "/stash";
  fs::create_directories(stash);
  FaultFileSystem ffs(stash);
  auto dir = ffs.OpenDir(AT_FDCWD, root.path(), root.path());
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(ffs.Mkdir(dir->get(), "d", "d").ok());
  ASSERT_TRUE(ffs.Sync(dir->get(), "root").ok());  // "d" is durable
  auto d = ffs.OpenDir(dir->get(), "d", "d");
  ASSERT_TRUE(d.ok());
  auto f = ffs.OpenWrite(d->get(), "synced", true, false, "synced");
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(ffs.Write(f->get(), "one", 3, 0, "synced").ok());
  ASSERT_TRUE(ffs.Sync(f->get(), "synced").ok());
  ASSERT_TRUE(ffs.Sync(d->get(), "d").ok());
  ASSERT_TRUE(ffs.Write(f->get(), "two", 3, 0, "synced").ok());  // not synced
  auto g = ffs.OpenWrite(d->get(), "new", true, false, "new");   // entry not synced
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(ffs.Sync(g->get(), "new").ok());
  ASSERT_TRUE(ffs.Rename(d->get(), "synced", d->get(), "moved", false, "mv").ok());
  ffs.SimulateCrash(root.path());
  EXPECT_FALSE(fs::exists(root.path() + "/d/new"));
  EXPECT_FALSE(fs::exists(root.path() + "/d/moved"));
  ASSERT_TRUE(fs::exists(root.path() + "/d/synced"));
  std::FILE* in = std::fopen((root.path() + "/d/synced").c_str(), "r");
  ASSERT_NE(in, nullptr);
  char buf[8] = {};
  EXPECT_EQ(std::fread(buf, 1, sizeof(buf), in), 3u);
  std::fclose(in);
  EXPECT_EQ(std::string(buf), "one");
}

// Rank 1 opens its step's temporary directory, still empty, and rank 0
// opens its manager right then (a replaced rank rejoining while the others
// save): rank 0's cleanup removes the empty directory of what it takes for
// a crashed save. Rank 1's save goes on in a directory made again, and the
// step commits with both shards (it failed with "No such file or
// directory" creating rank 1's shard).
class OpenRank0WhenTheTmpDirIsOpened : public testing::PassThroughFileSystem {
 public:
  explicit OpenRank0WhenTheTmpDirIsOpened(CheckpointOptions rank0) : rank0_(std::move(rank0)) {}
  absl::StatusOr<internal::Fd> OpenDir(int dir, const std::string& name,
                                       const std::string& path) override {
    absl::StatusOr<internal::Fd> fd = PassThroughFileSystem::OpenDir(dir, name, path);
    if (name.rfind(".tmp-step-", 0) == 0 && !opened_.exchange(true)) {
      auto m = CheckpointManager::Open(rank0_);
      EXPECT_TRUE(m.ok()) << m.status();
      if (m.ok()) {
        std::lock_guard<std::mutex> l(mu_);
        rank0_mgr_ = *std::move(m);
      }
      ready_.notify_all();
    }
    return fd;
  }
  CheckpointManager* WaitForRank0() {
    std::unique_lock<std::mutex> l(mu_);
    ready_.wait_for(l, std::chrono::seconds(30), [&] { return rank0_mgr_ != nullptr; });
    return rank0_mgr_.get();
  }

 private:
  const CheckpointOptions rank0_;
  std::atomic<bool> opened_{false};
  std::mutex mu_;
  std::condition_variable ready_;
  std::unique_ptr<CheckpointManager> rank0_mgr_;
};

TEST(CheckpointFaults, ASaveGoesOnWhenAnotherRankOpeningRemovesItsEmptyTemporaryDirectory) {
  TempDir root;
  CheckpointOptions o = Options(root.path() + "/ckpt");
  o.world_size = 2;
  o.direct_io = false;
  o.shard_timeout = absl::Seconds(10);
  CheckpointOptions o0 = o;
  o0.rank = 0;
  o.rank = 1;
  OpenRank0WhenTheTmpDirIsOpened ffs(o0);
  auto rank1 = internal::OpenCheckpointManagerOn(o, ffs);
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  TestState s1;
  s1.Set(11);
  absl::Status saved1;
  std::thread t([&] { saved1 = (*rank1)->Save(1, s1.registry, {}).status(); });
  CheckpointManager* rank0 = ffs.WaitForRank0();
  absl::Status saved0 = absl::UnknownError("rank 0 never opened");
  TestState s0;
  s0.Set(10);
  if (rank0 != nullptr) saved0 = rank0->Save(1, s0.registry, {}).status();
  t.join();
  EXPECT_TRUE(saved1.ok()) << saved1;
  EXPECT_TRUE(saved0.ok()) << saved0;
  EXPECT_TRUE(VerifyCheckpoint(StepDir(o.dir, 1)).ok());
}

}  // namespace
}  // namespace omni
