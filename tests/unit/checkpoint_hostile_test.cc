// Checkpoints under hostile directories: symbolic links planted in the
// checkpoint directory, FIFOs and special files in place of its files,
// files over the read limits, directories holding only invalid checkpoints,
// a process over its file size limit; and the operator CLI on such input.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "omni/checkpoint.h"
#include "omni/state.h"
#include "temp_dir.h"

namespace omni {
namespace {

namespace fs = std::filesystem;

::testing::AssertionResult Contains(absl::string_view text, absl::string_view part) {
  if (text.find(part) != absl::string_view::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

using test_util::TempDir;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

std::string StepName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%012lld", static_cast<long long>(step));
  return buf;
}

std::string StepDir(const std::string& root, int64_t step) {
  return (fs::path(root) / StepName(step)).string();
}

std::string Shard(const std::string& root, int64_t step) {
  return StepDir(root, step) + "/rank-00000.safetensors";
}

// A 4x4 float tensor and a step counter.
struct TestState {
  TestState() : w("w", data.data(), sizeof(float) * data.size()) {
    EXPECT_TRUE(registry.Register("model", &w).ok());
  }
  void Set(int64_t s) {
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(s) + 0.5f * i;
  }
  std::array<float, 16> data{};
  BytesState w;
  StateRegistry registry;
};

CheckpointOptions Options(const std::string& dir) {
  CheckpointOptions o;
  o.dir = dir;
  o.job_id = "job-1";
  o.keep_last = 100;
  return o;
}

std::unique_ptr<CheckpointManager> MustOpen(const CheckpointOptions& o) {
  auto m = CheckpointManager::Open(o);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

void SaveSteps(const CheckpointOptions& o, std::initializer_list<int64_t> steps) {
  auto m = MustOpen(o);
  ASSERT_NE(m, nullptr);
  TestState s;
  for (int64_t step : steps) {
    s.Set(step);
    auto st = m->Save(step, s.registry, {});
    ASSERT_TRUE(st.ok()) << st.status();
  }
}

// Runs `fn` in a forked child bounded by alarm(10): returns its exit code,
// or -signal when it was killed (a blocked reader is killed by SIGALRM).
int InChild(const std::function<int()>& fn) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(10);
    ::_exit(fn());
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  return WEXITSTATUS(status);
}

// ---------------------------------------------------------------- symbolic links

TEST(CheckpointHostile, TmpDirectorySymlinkedOutIsRefusedAtOpenAndItsTargetUntouched) {
  TempDir root;
  const std::string ckpt = root / "ckpt";
  const std::string victim = root / "victim";
  fs::create_directories(ckpt);
  fs::create_directories(victim);
  WriteAll(victim + "/rank-00000.safetensors", "precious 0");
  WriteAll(victim + "/notes.txt", "precious 1");
  fs::create_directory_symlink(victim, ckpt + "/.tmp-step-000000000002");

  auto m = CheckpointManager::Open(Options(ckpt));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(m.status().message(), ".tmp-step-000000000002"));
  EXPECT_TRUE(Contains(m.status().message(), "symbolic link"));
  EXPECT_EQ(ReadAll(victim + "/rank-00000.safetensors"), "precious 0");
  EXPECT_EQ(ReadAll(victim + "/notes.txt"), "precious 1");
}

TEST(CheckpointHostile, TmpDirectorySymlinkPlantedDuringTheRunFailsTheSaveAndWritesNothingThere) {
  TempDir root;
  const std::string ckpt = root / "ckpt";
  const std::string victim = root / "victim";
  fs::create_directories(victim);
  WriteAll(victim + "/rank-00000.safetensors", "precious");
  auto m = MustOpen(Options(ckpt));
  ASSERT_NE(m, nullptr);
  fs::create_directory_symlink(victim, ckpt + "/.tmp-step-000000000002");
  TestState s;
  s.Set(2);
  auto st = m->Save(2, s.registry, {});
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(Contains(st.status().message(), "symbolic link")) << st.status();
  EXPECT_EQ(ReadAll(victim + "/rank-00000.safetensors"), "precious");
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(victim)) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"rank-00000.safetensors"});
  EXPECT_FALSE(fs::exists(StepDir(ckpt, 2)));
}

TEST(CheckpointHostile, LockFileSymlinkIsRefusedAndItsTargetNeitherTruncatedNorWritten) {
  TempDir root;
  const std::string ckpt = root / "ckpt";
  fs::create_directories(ckpt);
  WriteAll(root / "victim.txt", "do not touch");
  fs::create_symlink(root / "victim.txt", ckpt + "/.lock-rank-00000");
  auto m = CheckpointManager::Open(Options(ckpt));
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(Contains(m.status().message(), ".lock-rank-00000"));
  EXPECT_TRUE(Contains(m.status().message(), "symbolic link"));
  EXPECT_EQ(ReadAll(root / "victim.txt"), "do not touch");
}

TEST(CheckpointHostile, StepDirectorySymlinkIsReportedInvalidAndNeverFollowedOrDeleted) {
  TempDir root;
  const std::string a = root / "a";
  const std::string b = root / "b";
  SaveSteps(Options(b), {9});
  fs::create_directories(a);
  fs::create_directory_symlink(StepDir(b, 9), StepDir(a, 9));

  auto scan = ScanCheckpoints(a);
  ASSERT_TRUE(scan.ok()) << scan.status();
  ASSERT_EQ(scan->size(), 1u);
  EXPECT_FALSE((*scan)[0].status.ok());
  EXPECT_TRUE(Contains((*scan)[0].status.message(), "symbolic link"));

  CheckpointOptions o = Options(a);
  o.keep_last = 1;
  o.start_fresh = true;
  SaveSteps(o, {10, 11, 12});
  EXPECT_TRUE(fs::is_symlink(StepDir(a, 9)));
  EXPECT_TRUE(VerifyCheckpoint(StepDir(b, 9)).ok());
}

// ---------------------------------------------------------------- special files, limits

TEST(CheckpointHostile, FifoInPlaceOfTheManifestOrAShardIsRefusedWithoutBlocking) {
  TempDir dir;
  SaveSteps(Options(dir.path()), {1, 2});
  const std::string manifest = StepDir(dir.path(), 2) + "/manifest.json";
  fs::remove(manifest);
  ASSERT_EQ(::mkfifo(manifest.c_str(), 0644), 0);
  fs::remove(Shard(dir.path(), 1));
  ASSERT_EQ(::mkfifo(Shard(dir.path(), 1).c_str(), 0644), 0);

  EXPECT_EQ(InChild([&] {
              auto scan = ScanCheckpoints(dir.path());
              if (!scan.ok() || scan->size() != 2) return 2;
              for (const CheckpointStatus& c : *scan) {
                if (c.status.ok()) return 3;
              }
              if ((*scan)[0].status.message().find("FIFO") == absl::string_view::npos) return 4;
              if (VerifyCheckpoint(StepDir(dir.path(), 1)).ok()) return 5;
              if (VerifyCheckpoint(StepDir(dir.path(), 2)).ok()) return 6;
              if (DescribeCheckpoint(StepDir(dir.path(), 2)).ok()) return 7;
              CheckpointOptions o = Options(dir.path());
              auto m = CheckpointManager::Open(o);
              if (!m.ok()) return 8;
              TestState s;
              auto r = (*m)->Restore(s.registry);
              return !r.ok() && absl::IsFailedPrecondition(r.status()) ? 0 : 9;
            }),
            0);
}

TEST(CheckpointHostile, ManifestLinkedToDevZeroIsNotRead) {
  TempDir dir;
  SaveSteps(Options(dir.path()), {1});
  const std::string manifest = StepDir(dir.path(), 1) + "/manifest.json";
  fs::remove(manifest);
  fs::create_symlink("/dev/zero", manifest);
  EXPECT_EQ(InChild([&] {
              auto scan = ScanCheckpoints(dir.path());
              return scan.ok() && scan->size() == 1 && !(*scan)[0].status.ok() ? 0 : 2;
            }),
            0);
}

TEST(CheckpointHostile, ManifestOverTheLimitIsRefusedBeforeItIsRead) {
  TempDir dir;
  SaveSteps(Options(dir.path()), {1});
  const std::string manifest = StepDir(dir.path(), 1) + "/manifest.json";
  {
    const int fd = ::open(manifest.c_str(), O_WRONLY | O_TRUNC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, CheckpointManager::kMaxManifestBytes + 1), 0);  // sparse
    ::close(fd);
  }
  auto scan = ScanCheckpoints(dir.path());
  ASSERT_TRUE(scan.ok());
  ASSERT_EQ(scan->size(), 1u);
  EXPECT_EQ((*scan)[0].status.code(), absl::StatusCode::kResourceExhausted) << (*scan)[0].status;
  EXPECT_TRUE(Contains((*scan)[0].status.message(), "limit"));
  EXPECT_TRUE(Contains((*scan)[0].status.message(), "manifest.json"));
}

TEST(CheckpointHostile, ACorruptShardHeaderMakesTheCheckpointInvalidInTheListing) {
  TempDir dir;
  SaveSteps(Options(dir.path()), {1});
  std::string shard = ReadAll(Shard(dir.path(), 1));
  const size_t at = shard.find("\"model/w\"");
  ASSERT_NE(at, std::string::npos);
  shard[at + 1] = 'n';  // another key, same size
  WriteAll(Shard(dir.path(), 1), shard);
  auto scan = ScanCheckpoints(dir.path());
  ASSERT_TRUE(scan.ok());
  ASSERT_EQ(scan->size(), 1u);
  EXPECT_FALSE((*scan)[0].status.ok());
  EXPECT_TRUE(Contains((*scan)[0].status.message(), "rank-00000.safetensors"));
  auto valid = ListCheckpoints(dir.path());
  ASSERT_TRUE(valid.ok());
  EXPECT_TRUE(valid->empty());
}

// ---------------------------------------------------------------- no silent restart

TEST(CheckpointHostile, OnlyInvalidCheckpointsRefuseToStartUnlessToldToStartFresh) {
  TempDir dir;
  SaveSteps(Options(dir.path()), {5, 6});
  fs::resize_file(Shard(dir.path(), 5), 10);
  WriteAll(StepDir(dir.path(), 6) + "/manifest.json", "{ not json");

  TestState s;
  {
    auto m = MustOpen(Options(dir.path()));
    auto r = m->Restore(s.registry);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
    EXPECT_TRUE(Contains(r.status().message(), StepName(5)));
    EXPECT_TRUE(Contains(r.status().message(), StepName(6)));
    EXPECT_TRUE(Contains(r.status().message(), "start fresh"));
  }
  CheckpointOptions fresh = Options(dir.path());
  fresh.start_fresh = true;
  auto m = MustOpen(fresh);
  auto r = m->Restore(s.registry);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_TRUE(Contains(r.status().message(), StepName(5)));
}

TEST(CheckpointHostile, RetentionCountsValidCheckpointsOnlyAndNeverDeletesTheNewestValid) {
  TempDir dir;
  SaveSteps(Options(dir.path()), {5000, 6000});
  fs::resize_file(Shard(dir.path(), 5000), 10);
  fs::resize_file(Shard(dir.path(), 6000), 10);
  CheckpointOptions o = Options(dir.path());
  o.keep_last = 2;
  o.start_fresh = true;
  SaveSteps(o, {1, 2, 3});
  auto valid = ListCheckpoints(dir.path());
  ASSERT_TRUE(valid.ok());
  std::vector<int64_t> steps;
  for (const CheckpointInfo& c : *valid) steps.push_back(c.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{3, 2}));
  // The invalid ones are left for the operator (reported at every start).
  EXPECT_TRUE(fs::exists(StepDir(dir.path(), 5000)));
  EXPECT_TRUE(fs::exists(StepDir(dir.path(), 6000)));
}

// ---------------------------------------------------------------- SIGXFSZ

TEST(CheckpointHostile, FileSizeLimitUnderTheDefaultSignalActionFailsTheSaveInsteadOfKilling) {
  TempDir dir;
  const int rc = InChild([&] {
    ::signal(SIGXFSZ, SIG_DFL);  // as in a fresh process
    auto m = CheckpointManager::Open(Options(dir.path()));
    if (!m.ok()) return 2;
    TestState small;
    small.Set(1);
    if (!(*m)->Save(1, small.registry, {}).ok()) return 3;
    struct rlimit lim = {4096, 4096};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return 4;
    std::vector<float> big(1 << 16, 1.0f);  // 256 KiB
    BytesState big_state("big", big.data(), big.size() * sizeof(float));
    StateRegistry reg;
    if (!reg.Register("big", &big_state).ok()) return 5;
    auto st = (*m)->Save(2, reg, {});
    if (st.ok()) return 6;
    if (st.status().code() != absl::StatusCode::kResourceExhausted) return 7;
    if (st.status().message().find("File too large") == absl::string_view::npos) return 8;
    return 0;
  });
  ASSERT_EQ(rc, 0) << (rc == -SIGXFSZ ? "killed by SIGXFSZ" : "wrong outcome");
  EXPECT_FALSE(fs::exists(StepDir(dir.path(), 2)));
  EXPECT_TRUE(VerifyCheckpoint(StepDir(dir.path(), 1)).ok());
}

// ---------------------------------------------------------------- the CLI

std::string BinDir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  return fs::path(std::string(buf, static_cast<size_t>(n))).parent_path().string();
}

int RunCli(const std::string& args, std::string& out) {
  const std::string cmd = "timeout 20 " + BinDir() + "/omni " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  out.clear();
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(CheckpointHostile, CliVerifyOfADirectoryWithoutCheckpointsFails) {
  if (!fs::exists(BinDir() + "/omni")) GTEST_SKIP() << "the omni CLI is not built";
  TempDir dir;
  std::string out;
  EXPECT_EQ(RunCli("ckpt verify " + dir.path(), out), 1) << out;
  EXPECT_TRUE(Contains(out, "no checkpoints"));
  EXPECT_EQ(RunCli("ckpt verify " + dir.path() + "/missing", out), 1) << out;
}

TEST(CheckpointHostile, CliListsACorruptHeaderAsInvalidAndDoesNotHangOnAFifo) {
  if (!fs::exists(BinDir() + "/omni")) GTEST_SKIP() << "the omni CLI is not built";
  TempDir dir;
  SaveSteps(Options(dir.path()), {1, 2});
  std::string shard = ReadAll(Shard(dir.path(), 1));
  const size_t at = shard.find("\"model/w\"");
  ASSERT_NE(at, std::string::npos);
  shard[at + 1] = 'n';  // another key, same size
  WriteAll(Shard(dir.path(), 1), shard);
  const std::string manifest = StepDir(dir.path(), 2) + "/manifest.json";
  fs::remove(manifest);
  ASSERT_EQ(::mkfifo(manifest.c_str(), 0644), 0);
  std::string out;
  EXPECT_EQ(RunCli("ckpt ls " + dir.path(), out), 0) << out;
  EXPECT_FALSE(Contains(out, "yes")) << out;
  EXPECT_TRUE(Contains(out, "FIFO")) << out;
  EXPECT_EQ(RunCli("ckpt verify " + dir.path(), out), 1) << out;
  EXPECT_EQ(RunCli("ckpt show " + StepDir(dir.path(), 2), out), 1) << out;
}

TEST(CheckpointHostile, CliRefusesNumericOptionsOutOfRangeNamingTheFlag) {
  if (!fs::exists(BinDir() + "/omni")) GTEST_SKIP() << "the omni CLI is not built";
  TempDir dir;
  const std::string log = dir / "missing.jsonl";
  std::string out;
  for (const std::string& bad :
       {std::string("stats ") + log + " --window 99999999999",
        std::string("forecast ") + log + " --horizon-s 1e300",
        std::string("eval ") + log + " --stride -3", std::string("stats ") + log + " --window 2.5",
        std::string("forecast ") + log + " --at-step 1e19",
        std::string("eval ") + log + " --window 4"}) {
    EXPECT_EQ(RunCli(bad, out), 2) << bad << ": " << out;
    EXPECT_TRUE(Contains(out, "--")) << out;
  }
}

}  // namespace
}  // namespace omni
