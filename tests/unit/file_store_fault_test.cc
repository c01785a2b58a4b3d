// Every operation of a FileStore write, failed (EIO, ENOSPC) or crashed at
// (tests/unit/fault_fs.h drops what was not fsynced): afterwards the key
// holds its previous value or its new one, never a mix and never nothing
// new; other keys are untouched; a failure is a Status naming the key; a
// durable write that returned OK survives the crash; and the store goes on.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "fault_fs.h"
#include "omni/store.h"
#include "pass_through_fs.h"
#include "store/file_store.h"
#include "temp_dir.h"

namespace omni {
namespace {

namespace fs = std::filesystem;
using test_util::TempDir;
using testing::FaultFileSystem;

constexpr char kKey[] = "gen/7";
constexpr char kOther[] = "hb/r1";

// One write to the store and what it changes kKey from and to.
struct Case {
  std::string name;
  std::optional<std::string> before;  // kKey's value before (nullopt: missing)
  std::optional<std::string> after;   // kKey's value after success (nullopt: missing)
  std::function<absl::Status(Store&)> run;
};

std::vector<Case> Cases() {
  const std::string big(100000, 'v');  // more than one page
  return {
      {"Set of a new key", std::nullopt, "fresh", [](Store& s) { return s.Set(kKey, "fresh"); }},
      {"Set replacing a value", "previous", big, [big](Store& s) { return s.Set(kKey, big); }},
      {"CompareAndSet of a missing key", std::nullopt, "first",
       [](Store& s) { return s.CompareAndSet(kKey, "", "first").status(); }},
      {"CompareAndSet replacing a value", "previous", "swapped",
       [](Store& s) { return s.CompareAndSet(kKey, "previous", "swapped").status(); }},
      {"Add", "41", "42", [](Store& s) { return s.Add(kKey, 1).status(); }},
      {"Delete", "previous", std::nullopt, [](Store& s) { return s.Delete(kKey).status(); }},
  };
}

std::optional<std::string> ValueOf(const std::string& dir, const std::string& key) {
  auto store = OpenStore("file://" + dir);
  EXPECT_TRUE(store.ok()) << store.status();
  if (!store.ok()) return std::nullopt;
  auto v = (*store)->TryGet(key);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? *v : std::nullopt;
}

std::string Show(const std::optional<std::string>& v) {
  if (!v.has_value()) return "(missing)";
  return v->size() > 20 ? absl::StrCat(v->size(), " bytes") : absl::StrCat("'", *v, "'");
}

struct Outcome {
  int64_t ops = 0;
  bool fired = false;
  absl::Status status;
};

// Seeds kKey and kOther on the real file system, then runs `c` on a store
// over the fault-injecting one armed with (mode, at, err).
Outcome RunUnderFault(const std::string& root, const Case& c, bool durable,
                      FaultFileSystem::Mode mode, int64_t at, int err) {
  const std::string dir = root + "/store";
  const std::string stash = root + "/stash";
  fs::create_directories(stash);
  {
    auto seed = OpenStore("file://" + dir);
    EXPECT_TRUE(seed.ok()) << seed.status();
    if (c.before.has_value()) {
      EXPECT_TRUE((*seed)->Set(kKey, *c.before).ok());
    }
    EXPECT_TRUE((*seed)->Set(kOther, "beat:1").ok());
  }
  FaultFileSystem ffs(stash);
  Outcome out;
  {
    auto store = internal::OpenFileStoreOn(dir, durable, ffs);
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return out;
    ffs.Arm(mode, at, err);
    out.status = c.run(**store);
  }
  out.ops = ffs.ops();
  out.fired = ffs.fired();
  if (mode == FaultFileSystem::Mode::kCrash) ffs.SimulateCrash(dir);
  return out;
}

void CheckAfter(const std::string& root, const Case& c, bool durable, const Outcome& o,
                FaultFileSystem::Mode mode, const std::string& what) {
  SCOPED_TRACE(what);
  const std::string dir = root + "/store";
  const std::optional<std::string> now = ValueOf(dir, kKey);
  EXPECT_TRUE(now == c.before || now == c.after)
      << "key holds " << Show(now) << ", neither the previous " << Show(c.before) << " nor the new "
      << Show(c.after);
  // What returned OK is there, unless a crash took what was not durable.
  if (o.status.ok() && (mode != FaultFileSystem::Mode::kCrash || durable)) {
    EXPECT_EQ(Show(now), Show(c.after)) << "a write that returned OK is lost";
  }
  if (!o.status.ok()) {
    EXPECT_TRUE(absl::StrContains(o.status.message(), absl::StrCat("key '", kKey, "'")))
        << o.status;
    EXPECT_TRUE(absl::StrContains(o.status.message(), dir)) << o.status;
  }
  EXPECT_EQ(ValueOf(dir, kOther), std::optional<std::string>("beat:1"));
  // Opening removed any temporary a dead writer left; the store goes on.
  auto store = OpenStore("file://" + dir);
  ASSERT_TRUE(store.ok()) << store.status();
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_FALSE(absl::StrContains(e.path().filename().string(), ".tmp.")) << e.path();
  }
  ASSERT_TRUE((*store)->Set(kKey, "next").ok());
  EXPECT_EQ(ValueOf(dir, kKey), std::optional<std::string>("next"));
}

int64_t CountOps(const Case& c, bool durable) {
  TempDir root;
  const Outcome o = RunUnderFault(root.path(), c, durable, FaultFileSystem::Mode::kNone, -1, 0);
  EXPECT_TRUE(o.status.ok()) << o.status;
  CheckAfter(root.path(), c, durable, o, FaultFileSystem::Mode::kNone, c.name + ", no fault");
  return o.ops;
}

TEST(FileStoreFaults, EveryOperationOfAWriteFailingWithEioOrEnospcKeepsTheOldValueOrTheNew) {
  for (const bool durable : {false, true}) {
    for (const Case& c : Cases()) {
      const int64_t n = CountOps(c, durable);
      ASSERT_GE(n, 3) << c.name;
      int failed = 0;
      for (const int err : {EIO, ENOSPC}) {
        for (int64_t at = 0; at < n + 1; ++at) {
          TempDir root;
          const Outcome o =
              RunUnderFault(root.path(), c, durable, FaultFileSystem::Mode::kFail, at, err);
          if (o.fired && !o.status.ok()) ++failed;
          if (o.fired && err == ENOSPC && !o.status.ok()) {
            EXPECT_TRUE(absl::IsResourceExhausted(o.status)) << o.status;
          }
          CheckAfter(root.path(), c, durable, o, FaultFileSystem::Mode::kFail,
                     absl::StrCat(c.name, durable ? ", durable" : "", ": errno ", err,
                                  " at operation ", at, " of ", n));
        }
      }
      // Every operation's failure reached the caller.
      EXPECT_EQ(failed, 2 * n) << c.name;
    }
  }
}

TEST(FileStoreFaults, ACrashAtEveryOperationOfAWriteKeepsTheOldValueOrTheNewAndDurableOnesStay) {
  for (const bool durable : {false, true}) {
    for (const Case& c : Cases()) {
      const int64_t n = CountOps(c, durable);
      int kept_new = 0;
      for (int64_t at = 0; at < n + 1; ++at) {
        TempDir root;
        const Outcome o =
            RunUnderFault(root.path(), c, durable, FaultFileSystem::Mode::kCrash, at, EIO);
        if (ValueOf(root.path() + "/store", kKey) == c.after) ++kept_new;
        CheckAfter(root.path(), c, durable, o, FaultFileSystem::Mode::kCrash,
                   absl::StrCat(c.name, durable ? ", durable" : "", ": crash at operation ", at,
                                " of ", n));
      }
      // Durable: the write survived the crashes after its last fsync (and
      // the run without one). Not durable, nothing was fsynced, so the
      // crash model keeps only the previous value.
      if (durable) {
        EXPECT_GE(kept_new, 1) << c.name;
      }
    }
  }
}

TEST(FileStoreFaults, AFullDiskFailsTheSetNamingTheStoreAndTheKey) {
  TempDir root;
  const Case c{"Set", "previous", "new", [](Store& s) { return s.Set(kKey, "new"); }};
  // Operation 3 creates the temporary (0 opens the directory, 1 the store's
  // lock, 2 the key's).
  const Outcome o = RunUnderFault(root.path(), c, false, FaultFileSystem::Mode::kFail, 3, ENOSPC);
  ASSERT_TRUE(o.fired);
  EXPECT_TRUE(absl::IsResourceExhausted(o.status)) << o.status;
  EXPECT_TRUE(absl::StartsWith(o.status.message(),
                               absl::StrCat("FileStore ", root.path(), "/store: key 'gen/7': ")))
      << o.status;
  EXPECT_EQ(ValueOf(root.path() + "/store", kKey), std::optional<std::string>("previous"));
}

TEST(FileStoreFaults, ASymlinkedKeyFileIsRefusedNamingItAndItsTargetIsNotRead) {
  TempDir root;
  const std::string dir = root.path() + "/store";
  auto store = OpenStore("file://" + dir);
  ASSERT_TRUE(store.ok()) << store.status();
  {
    std::FILE* f = std::fopen((root.path() + "/secret").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("not a store value", f);
    std::fclose(f);
  }
  fs::create_symlink(root.path() + "/secret", dir + "/k-gen%7");
  auto v = (*store)->TryGet(kKey);
  ASSERT_FALSE(v.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(v.status())) << v.status();
  EXPECT_TRUE(absl::StrContains(v.status().message(), "key 'gen/7'")) << v.status();
}

// The real file system, except that the process stops itself (SIGSTOP) when
// it is about to rename a temporary of the key file `frozen` into place: a
// writer frozen mid-write, holding that key's lock (as a replica stopped by
// a debugger, a paused VM or the integration test's SIGSTOP).
class FreezeBeforeRename final : public testing::PassThroughFileSystem {
 public:
  explicit FreezeBeforeRename(std::string frozen) : frozen_(std::move(frozen)) {}

  absl::Status Rename(int from_dir, const std::string& from, int to_dir, const std::string& to,
                      bool exchange, const std::string& path) override {
    if (absl::StartsWith(from, frozen_ + ".tmp.")) ::raise(SIGSTOP);
    return PassThroughFileSystem::Rename(from_dir, from, to_dir, to, exchange, path);
  }

 private:
  const std::string frozen_;
};

// A replica frozen in the middle of writing its heartbeat held the store's
// one lock, so every other replica's writes (their heartbeats, the
// generation records) waited for it for 60 s and the group could not evict
// it (the integration test test_a_frozen_replica_is_evicted_and_rejoins_
// cleanly hung so). Now it holds up only the key it was writing: other keys
// are written, a new process opens the store without removing its
// temporary, and once it runs again its write lands.
TEST(FileStoreFaults, AWriterFrozenMidWriteHoldsUpOnlyTheKeyItWasWriting) {
  TempDir root;
  const std::string dir = root.path() + "/store";
  auto store = OpenStore("file://" + dir);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Set("hb/r2", "beat 1").ok());
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    FreezeBeforeRename freeze("k-hb%r2");
    auto own = internal::OpenFileStoreOn(dir, /*durable=*/false, freeze);
    ::_exit(own.ok() && (*own)->Set("hb/r2", "beat 2").ok() ? 0 : 1);
  }
  // A failed assertion must not leave the child stopped (holding the
  // test's output open): it is killed unless it was reaped.
  bool reaped = false;
  struct KillUnlessReaped {
    pid_t pid;
    const bool& reaped;
    ~KillUnlessReaped() {
      if (reaped) return;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } guard{child, reaped};
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(status)) << "the writer did not freeze mid-write";

  // Opening the store (which removes dead writers' temporaries) does not
  // wait for the frozen writer, and keeps its temporary.
  auto other = OpenStore("file://" + dir);
  ASSERT_TRUE(other.ok()) << other.status();
  bool temporary_kept = false;
  for (const auto& e : fs::directory_iterator(dir)) {
    temporary_kept |= absl::StartsWith(e.path().filename().string(), "k-hb%r2.tmp.");
  }
  EXPECT_TRUE(temporary_kept);
  // Every other key is written, by every kind of write.
  EXPECT_TRUE((*other)->Set("hb/r0", "beat 7").ok());
  EXPECT_EQ(*(*other)->CompareAndSet("gen/2", "", "r0 r1 r3"), "r0 r1 r3");
  EXPECT_EQ(*(*other)->Add("join/seq", 1), 1);
  EXPECT_EQ(*(*other)->Delete("hb/r0"), true);
  // The frozen key still reads its last value.
  EXPECT_EQ(*(*other)->TryGet("hb/r2"), std::optional<std::string>("beat 1"));

  ASSERT_EQ(::kill(child, SIGCONT), 0);
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  reaped = true;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(*(*other)->TryGet("hb/r2"), std::optional<std::string>("beat 2"));
}

}  // namespace
}  // namespace omni
