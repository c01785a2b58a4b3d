// CheckpointOptions::read_only: restores, lists and verifies without a single
// mutating file operation (proved with a file system that refuses them all:
// the tests run as root, whom permissions do not stop), beside a live
// writer, and refuses to save.
#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "ckpt/checkpoint_fs.h"
#include "fault_fs.h"
#include "omni/checkpoint.h"
#include "omni/state.h"
#include "temp_dir.h"

namespace omni {
namespace {

namespace fs = std::filesystem;
using test_util::TempDir;
using testing::FaultFileSystem;

struct Values {
  Values() : bytes("v", data.data(), sizeof(float) * data.size()) {
    EXPECT_TRUE(registry.Register("v", &bytes).ok());
  }
  void Set(float x) { data.fill(x); }
  std::array<float, 64> data{};
  BytesState bytes;
  StateRegistry registry;
};

CheckpointOptions Writable(const std::string& dir) {
  CheckpointOptions o;
  o.dir = dir;
  o.job_id = "job";
  o.keep_last = 1;  // a writer would delete step 1 at its next save
  return o;
}

CheckpointOptions ReadOnly(const std::string& dir) {
  CheckpointOptions o = Writable(dir);
  o.read_only = true;
  return o;
}

// Every entry under `root`: its type, size and modification time.
std::map<std::string, std::string> Tree(const std::string& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    const auto st = fs::symlink_status(e.path());
    std::string what = std::to_string(static_cast<int>(st.type()));
    if (fs::is_regular_file(st)) {
      what += " " + std::to_string(fs::file_size(e.path())) + " " +
              std::to_string(fs::last_write_time(e.path()).time_since_epoch().count());
    }
    out[e.path().string()] = what;
  }
  return out;
}

// Steps 1 and 2 (keep_last 1 kept both: 1 was saved with keep_last 2), plus
// what a crashed writer leaves: a temporary directory with a file in it.
void Populate(const std::string& dir) {
  CheckpointOptions o = Writable(dir);
  o.keep_last = 2;
  auto m = CheckpointManager::Open(o);
  ASSERT_TRUE(m.ok()) << m.status();
  Values v;
  for (int step : {1, 2}) {
    v.Set(static_cast<float>(step));
    ASSERT_TRUE((*m)->Save(step, v.registry, {}).ok());
  }
  fs::create_directories(dir + "/.tmp-step-000000000003");
  std::ofstream(dir + "/.tmp-step-000000000003/rank-00000.safetensors") << "half";
}

TEST(CheckpointReadOnly, RestoresAndListsWithoutASingleMutatingOperationAndRefusesToSave) {
  TempDir root;
  const std::string dir = root / "ckpt";
  Populate(dir);
  fs::create_directories(root / "stash");
  const auto before = Tree(dir);
  FaultFileSystem ffs(root / "stash");
  ffs.RefuseMutations(true);
  {
    auto m = internal::OpenCheckpointManagerOn(ReadOnly(dir), ffs);
    ASSERT_TRUE(m.ok()) << m.status();
    auto list = (*m)->List();
    ASSERT_TRUE(list.ok()) << list.status();
    ASSERT_EQ(list->size(), 2u);
    Values v;
    auto r = (*m)->Restore(v.registry);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->info.step, 2);
    EXPECT_EQ(v.data[0], 2.0f);
    auto old = (*m)->Restore(v.registry, 1);
    ASSERT_TRUE(old.ok()) << old.status();
    EXPECT_EQ(v.data[0], 1.0f);
    auto saved = (*m)->Save(3, v.registry, {});
    ASSERT_FALSE(saved.ok());
    EXPECT_EQ(saved.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(saved.status().message().find("read-only"), std::string::npos) << saved.status();
    EXPECT_NE(saved.status().message().find(dir), std::string::npos) << saved.status();
    auto async = (*m)->SaveAsync(3, v.registry, {});
    ASSERT_FALSE(async.ok());
    EXPECT_EQ(async.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE((*m)->WaitForPending().ok());
  }
  EXPECT_EQ(ffs.refused(), 0) << "a read-only manager tried to change the directory";
  EXPECT_GT(ffs.ops(), 0);
  EXPECT_EQ(Tree(dir), before);  // the crashed writer's files too
  EXPECT_TRUE(VerifyCheckpoint(dir + "/step-000000000001").ok());
}

// The same file system makes a writable Open fail: the test above can fail.
TEST(CheckpointReadOnly, AWritableOpenOnTheRefusingFileSystemFails) {
  TempDir root;
  const std::string dir = root / "ckpt";
  Populate(dir);
  fs::create_directories(root / "stash");
  FaultFileSystem ffs(root / "stash");
  ffs.RefuseMutations(true);
  auto m = internal::OpenCheckpointManagerOn(Writable(dir), ffs);
  EXPECT_FALSE(m.ok());
  EXPECT_GT(ffs.refused(), 0);
}

TEST(CheckpointReadOnly, OpensAndRestoresBesideALiveWriterWhichGoesOnSaving) {
  TempDir root;
  const std::string dir = root / "ckpt";
  Populate(dir);
  auto writer = CheckpointManager::Open(Writable(dir));
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_FALSE(CheckpointManager::Open(Writable(dir)).ok());  // the lock is held
  auto reader = CheckpointManager::Open(ReadOnly(dir));
  ASSERT_TRUE(reader.ok()) << reader.status();
  Values v;
  auto r = (*reader)->Restore(v.registry);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->info.step, 2);
  v.Set(4.0f);
  ASSERT_TRUE((*writer)->Save(4, v.registry, {}).ok());
  auto list = (*reader)->List();
  ASSERT_TRUE(list.ok());
  ASSERT_FALSE(list->empty());
  EXPECT_EQ(list->front().step, 4);
}

TEST(CheckpointReadOnly, AMissingDirectoryIsNotFoundAndNotCreated) {
  TempDir root;
  const std::string dir = root / "nothing/here";
  auto m = CheckpointManager::Open(ReadOnly(dir));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound) << m.status();
  EXPECT_NE(m.status().message().find(dir), std::string::npos) << m.status();
  EXPECT_FALSE(fs::exists(root / "nothing"));
}

}  // namespace
}  // namespace omni
