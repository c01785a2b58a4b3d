// Real processes and real directories: pausing a guest process, and removing a
// job's temporary checkpoint files.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "omni/colocate_cleanup.h"
#include "omni/colocate_pause.h"

namespace omni::colocate {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "omni_colocate_XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  fs::path path() const { return path_; }

 private:
  std::string path_;
};

void Write(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }

// A child that spins, counting in shared memory, until killed.
class SpinningChild {
 public:
  SpinningChild() {
    void* m = mmap(nullptr, sizeof(std::atomic<int64_t>), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    counter_ = new (m) std::atomic<int64_t>(0);
    pid_ = fork();
    if (pid_ == 0) {
      for (;;) counter_->fetch_add(1, std::memory_order_relaxed);
    }
  }
  ~SpinningChild() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    munmap(counter_, sizeof(*counter_));
  }
  pid_t pid() const { return pid_; }
  int64_t count() const { return counter_->load(std::memory_order_relaxed); }
  // Waits (at most 5 s) until the count moves past `from`.
  bool Advances(int64_t from) const {
    const absl::Time limit = absl::Now() + absl::Seconds(5);
    while (absl::Now() < limit) {
      if (count() > from) return true;
      absl::SleepFor(absl::Microseconds(100));
    }
    return false;
  }

 private:
  pid_t pid_ = -1;
  std::atomic<int64_t>* counter_ = nullptr;
};

TEST(ProcessPauserTest, PauseStopsARealGuestProcessAndResumeContinuesIt) {
  SpinningChild child;
  ASSERT_TRUE(child.Advances(0));
  ProcessPauser pauser(child.pid());
  std::vector<double> pause_us;
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<absl::Duration> paused = pauser.Pause();
    ASSERT_TRUE(paused.ok()) << paused.status();
    pause_us.push_back(absl::ToDoubleMicroseconds(*paused));
    EXPECT_EQ(*ProcessState(child.pid()), 'T');
    const int64_t frozen = child.count();
    absl::SleepFor(absl::Milliseconds(5));
    EXPECT_EQ(child.count(), frozen) << "a stopped guest made progress";
    absl::StatusOr<absl::Duration> resumed = pauser.Resume();
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    EXPECT_TRUE(child.Advances(frozen)) << "the guest did not continue";
  }
  std::sort(pause_us.begin(), pause_us.end());
  // The yield latency of a pause: from SIGSTOP to the kernel reporting the
  // process stopped (reported, not asserted beyond the timeout: it depends
  // on the machine's load).
  std::printf("pause latency over %zu pauses: p50 %.0f us, max %.0f us\n", pause_us.size(),
              pause_us[pause_us.size() / 2], pause_us.back());
  RecordProperty("pause_p50_us", static_cast<int>(pause_us[pause_us.size() / 2]));
  RecordProperty("pause_max_us", static_cast<int>(pause_us.back()));
}

TEST(ProcessPauserTest, APauserOfItsOwnChildWaitsForTheKernelsReportOfTheStop) {
  SpinningChild child;
  ASSERT_TRUE(child.Advances(0));
  ProcessPauser pauser(child.pid(), /*is_child=*/true);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(pauser.Pause().ok());
    EXPECT_EQ(*ProcessState(child.pid()), 'T') << "stopped when Pause returns";
    const int64_t frozen = child.count();
    ASSERT_TRUE(pauser.Resume().ok());
    EXPECT_TRUE(child.Advances(frozen)) << "the guest did not continue";
  }
}

TEST(ProcessPauserTest, TheGuestsCpuTimeStandsStillWhileItIsPausedAndGrowsWhileItRuns) {
  SpinningChild child;
  ASSERT_TRUE(child.Advances(0));
  ProcessPauser pauser(child.pid(), /*is_child=*/true);
  // The kernel may account a thread's last stretch on the CPU a little after
  // it has stopped (seen once under load: 0 ns read right after the stop,
  // 0.28 ms later): the stopped guest's clock is read once it has settled
  // (two reads 2 ms apart agree, at most 5 s), then must not move.
  const absl::Time settle_limit = absl::Now() + absl::Seconds(5);
  while (*pauser.CpuNanos() == 0 && absl::Now() < settle_limit) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(pauser.Pause().ok());
  absl::StatusOr<int64_t> stopped = pauser.CpuNanos();
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  for (;;) {
    absl::SleepFor(absl::Milliseconds(2));
    const int64_t again = *pauser.CpuNanos();
    if (again == *stopped || absl::Now() > settle_limit) break;
    *stopped = again;
  }
  EXPECT_GT(*stopped, 0);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(*pauser.CpuNanos(), *stopped) << "a stopped guest used CPU";
  ASSERT_TRUE(pauser.Resume().ok());
  // A running thread's time reaches the clock at the kernel's next update of
  // it (a tick at most): wait for that, at most 5 s.
  const absl::Time limit = absl::Now() + absl::Seconds(5);
  while (*pauser.CpuNanos() == *stopped && absl::Now() < limit) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_GT(*pauser.CpuNanos(), *stopped) << "a running guest's CPU clock did not move";
}

TEST(ProcessPauserTest, DestroyingAPauserResumesTheGuest) {
  SpinningChild child;
  ASSERT_TRUE(child.Advances(0));
  int64_t frozen = 0;
  {
    ProcessPauser pauser(child.pid());
    ASSERT_TRUE(pauser.Pause().ok());
    frozen = child.count();
  }
  EXPECT_TRUE(child.Advances(frozen));
}

TEST(ProcessPauserTest, AMissingProcessIsNotFound) {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  waitpid(pid, nullptr, 0);  // reaped: the pid names no process now
  ProcessPauser pauser(pid);
  EXPECT_EQ(pauser.Pause().status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ProcessState(pid).status().code(), absl::StatusCode::kNotFound);
}

TEST(RemoveTempCheckpointsTest, RemovesTheJobsTemporariesAndKeepsCommittedSteps) {
  TempDir d;
  const fs::path tmp = d.path() / ".tmp-step-000000000007";
  fs::create_directories(tmp / "nested");
  Write(tmp / "shard-0.safetensors", std::string(1000, 'x'));
  Write(tmp / "nested" / "frag", "yy");
  Write(d.path() / ".tmp-step-000000000008", "a stray file");
  fs::create_directories(d.path() / "step-000000000006");
  Write(d.path() / "step-000000000006" / "manifest.json", "{}");
  Write(d.path() / "unrelated.tmp", "kept");

  absl::StatusOr<CleanupReport> r = RemoveTempCheckpoints(d.path().string());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->entries_removed, 2);
  EXPECT_EQ(r->files_removed, 3);
  EXPECT_EQ(r->bytes_removed, 1000 + 2 + 12);
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_FALSE(fs::exists(d.path() / ".tmp-step-000000000008"));
  EXPECT_TRUE(fs::exists(d.path() / "step-000000000006" / "manifest.json"));
  EXPECT_TRUE(fs::exists(d.path() / "unrelated.tmp"));
}

TEST(RemoveTempCheckpointsTest, NeverFollowsASymlinkOutOfTheCheckpointDirectory) {
  TempDir d;
  TempDir outside;
  Write(outside.path() / "precious", "not yours");
  const fs::path ckpt = d.path() / "ckpt";
  fs::create_directories(ckpt / ".tmp-step-000000000001");
  // A link planted inside a temporary, and a temporary that is itself a link.
  fs::create_directory_symlink(outside.path(), ckpt / ".tmp-step-000000000001" / "evil");
  fs::create_directory_symlink(outside.path(), ckpt / ".tmp-step-000000000002");
  fs::create_symlink(outside.path() / "precious", ckpt / ".tmp-step-000000000003");

  absl::StatusOr<CleanupReport> r = RemoveTempCheckpoints(ckpt.string());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->entries_removed, 3);
  EXPECT_TRUE(fs::exists(outside.path() / "precious"));
  EXPECT_TRUE(fs::is_empty(ckpt));

  // A checkpoint directory that is a link is refused.
  fs::create_directory_symlink(outside.path(), d.path() / "linked");
  absl::StatusOr<CleanupReport> linked = RemoveTempCheckpoints((d.path() / "linked").string());
  EXPECT_EQ(linked.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(linked.status().message().find("symlink"), std::string::npos);
  EXPECT_TRUE(fs::exists(outside.path() / "precious"));
}

TEST(RemoveTempCheckpointsTest, LeavesEntriesOwnedByAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give an entry to another uid";
  TempDir d;
  const fs::path theirs = d.path() / ".tmp-step-000000000004";
  fs::create_directories(theirs);
  Write(theirs / "shard", "theirs");
  ASSERT_EQ(chown(theirs.c_str(), 12345, 12345), 0);
  absl::StatusOr<CleanupReport> r = RemoveTempCheckpoints(d.path().string());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->entries_removed, 0);
  ASSERT_EQ(r->skipped.size(), 1u);
  EXPECT_NE(r->skipped[0].find("uid 12345"), std::string::npos) << r->skipped[0];
  EXPECT_TRUE(fs::exists(theirs / "shard"));
}

TEST(RemoveTempCheckpointsTest, AMissingDirectoryIsNotFoundNamingIt) {
  absl::StatusOr<CleanupReport> r = RemoveTempCheckpoints("/nonexistent/omni/ckpt");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/omni/ckpt"), std::string::npos);
}

}  // namespace
}  // namespace omni::colocate
