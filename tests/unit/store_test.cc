#include "omni/store.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace omni {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  explicit TempDir(const fs::path& base = fs::temp_directory_path()) {
    std::string tmpl = (base / "omni_store_XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string Uri() const { return "file://" + path_; }

 private:
  std::string path_;
};

// For the tests that hammer the lock: every write fsyncs twice, which costs
// ~10 ms on a disk and nothing on tmpfs; locking behaves the same on both.
fs::path FastTempBase() {
  std::error_code ec;
  return fs::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0
             ? fs::path("/dev/shm")
             : fs::temp_directory_path();
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::unique_ptr<Store> MustOpen(const std::string& uri) {
  absl::StatusOr<std::unique_ptr<Store>> s = OpenStore(uri);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// Runs `child` in a forked process; its return value is the exit code.
pid_t Fork(const std::function<int()>& child) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(child());
  return pid;
}

bool ExitedZero(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// ---------------------------------------------------------------- basics

TEST(FileStore, SetGetTryGetDeleteRoundTrip) {
  TempDir dir;
  auto store = MustOpen(dir.Uri());
  ASSERT_NE(store, nullptr);

  auto missing = store->TryGet("a/b.c");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_FALSE(missing->has_value());

  const std::string binary("x\0y\n\xff", 5);
  ASSERT_TRUE(store->Set("a/b.c", binary).ok());
  auto got = store->TryGet("a/b.c");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ(**got, binary);

  auto waited = store->Get("a/b.c", absl::Seconds(1));
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_EQ(*waited, binary);

  ASSERT_TRUE(store->Set("a/b.c", "second").ok());
  EXPECT_EQ(*store->Get("a/b.c", absl::ZeroDuration()), "second");

  // Keys that differ only where the encoding maps characters stay distinct.
  ASSERT_TRUE(store->Set("a.b/c", "other").ok());
  ASSERT_TRUE(store->Set("..", "dots").ok());
  EXPECT_EQ(*store->Get("a/b.c", absl::ZeroDuration()), "second");
  EXPECT_EQ(*store->Get("a.b/c", absl::ZeroDuration()), "other");
  EXPECT_EQ(*store->Get("..", absl::ZeroDuration()), "dots");

  auto deleted = store->Delete("a/b.c");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_TRUE(*deleted);
  EXPECT_FALSE(store->TryGet("a/b.c")->has_value());
  auto again = store->Delete("a/b.c");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(*again);
}

TEST(FileStore, TwoOpensOfOneDirectoryShareKeys) {
  TempDir dir;
  auto a = MustOpen(dir.Uri());
  auto b = MustOpen(dir.Uri() + "/");
  ASSERT_TRUE(a->Set("k", "v").ok());
  EXPECT_EQ(*b->Get("k", absl::Seconds(1)), "v");
}

TEST(FileStore, GetWaitsForAKeySetLaterByAnotherThread) {
  TempDir dir;
  auto store = MustOpen(dir.Uri());
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_TRUE(store->Set("late", "here").ok());
  });
  const absl::Time start = absl::Now();
  auto got = store->Get("late", absl::Seconds(10));
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "here");
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(FileStore, GetTimesOutWithDeadlineExceededNamingTheKey) {
  TempDir dir;
  auto store = MustOpen(dir.Uri());
  const absl::Time start = absl::Now();
  auto got = store->Get("never/set", absl::Milliseconds(100));
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  EXPECT_TRUE(Contains(std::string(got.status().message()), "never/set")) << got.status();
  EXPECT_TRUE(Contains(std::string(got.status().message()), dir.path())) << got.status();
  EXPECT_GE(took, absl::Milliseconds(100));
  EXPECT_LT(took, absl::Seconds(5));
}

TEST(FileStore, WaitReturnsOnceAllKeysExistAndNamesTheMissingOnes) {
  TempDir dir;
  auto store = MustOpen(dir.Uri());
  ASSERT_TRUE(store->Set("one", "1").ok());
  absl::Status st = store->Wait({"one", "two"}, absl::Milliseconds(50));
  ASSERT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_TRUE(Contains(std::string(st.message()), "two")) << st;
  EXPECT_FALSE(Contains(std::string(st.message()), "one")) << st;

  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(30));
    EXPECT_TRUE(store->Set("two", "2").ok());
  });
  st = store->Wait({"one", "two"}, absl::Seconds(10));
  setter.join();
  EXPECT_TRUE(st.ok()) << st;
}

// ---------------------------------------------------------------- Add

TEST(FileStore, AddCreatesAtZeroAndReturnsTheNewValue) {
  TempDir dir;
  auto store = MustOpen(dir.Uri());
  EXPECT_EQ(*store->Add("n", 5), 5);
  EXPECT_EQ(*store->Add("n", -2), 3);
  EXPECT_EQ(*store->Get("n", absl::ZeroDuration()), "3");

  ASSERT_TRUE(store->Set("text", "hello").ok());
  auto bad = store->Add("text", 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(std::string(bad.status().message()), "text")) << bad.status();

  ASSERT_TRUE(store->Set("big", "9223372036854775807").ok());
  EXPECT_EQ(store->Add("big", 1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(FileStore, AddIsAtomicAcrossFourThreads) {
  TempDir dir(FastTempBase());
  auto store = MustOpen(dir.Uri());
  constexpr int kThreads = 4;
  constexpr int kIncrements = 200;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIncrements; ++i) {
        if (!store->Add("counter", 1).ok()) failures.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(*store->Add("counter", 0), kThreads * kIncrements);
}

TEST(FileStore, AddIsAtomicAcrossThreeProcesses) {
  TempDir dir(FastTempBase());
  constexpr int kProcs = 3;
  constexpr int kIncrements = 200;
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p) {
    pids.push_back(Fork([&] {
      auto s = OpenStore(dir.Uri());
      if (!s.ok()) return 2;
      for (int i = 0; i < kIncrements; ++i) {
        if (!(*s)->Add("counter", 1).ok()) return 3;
      }
      return 0;
    }));
  }
  for (pid_t pid : pids) {
    ASSERT_GT(pid, 0);
    EXPECT_TRUE(ExitedZero(pid));
  }
  auto store = MustOpen(dir.Uri());
  EXPECT_EQ(*store->Add("counter", 0), kProcs * kIncrements);
}

// Opening needs no exclusive lock (a frozen writer must not block it), so
// openings run side by side; each checks the directory with its own probe
// file. They once shared one name per process, and one opening removed the
// probe of another thread's (NotFound).
TEST(FileStore, ThreadsAndProcessesOpeningOneStoreAtOnceAllSucceed) {
  TempDir dir(FastTempBase());
  constexpr int kProcs = 2;
  constexpr int kThreads = 4;
  constexpr int kOpens = 50;
  const auto open_many = [&] {
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < kOpens; ++i) {
          if (!OpenStore(dir.Uri()).ok()) failures.fetch_add(1);
        }
      });
    }
    for (std::thread& t : threads) t.join();
    return failures.load();
  };
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p) pids.push_back(Fork([&] { return open_many() == 0 ? 0 : 1; }));
  EXPECT_EQ(open_many(), 0);
  for (pid_t pid : pids) {
    ASSERT_GT(pid, 0);
    EXPECT_TRUE(ExitedZero(pid));
  }
}

// ---------------------------------------------------------------- CompareAndSet

TEST(FileStore, CompareAndSetSwapsOnlyOnAMatch) {
  TempDir dir;
  auto store = MustOpen(dir.Uri());
  EXPECT_EQ(*store->CompareAndSet("k", "", "first"), "first");
  EXPECT_EQ(*store->CompareAndSet("k", "", "second"), "first");  // exists: "" never matches
  EXPECT_EQ(*store->CompareAndSet("k", "wrong", "third"), "first");
  EXPECT_EQ(*store->CompareAndSet("k", "first", "fourth"), "fourth");
  EXPECT_EQ(*store->Get("k", absl::ZeroDuration()), "fourth");

  auto absent = store->CompareAndSet("absent", "something", "x");
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(std::string(absent.status().message()), "absent")) << absent.status();
  EXPECT_FALSE(store->TryGet("absent")->has_value());
}

TEST(FileStore, CompareAndSetCreateIfAbsentHasExactlyOneWinner) {
  TempDir dir;
  auto store = MustOpen(dir.Uri());
  constexpr int kThreads = 8;
  std::vector<std::string> seen(kThreads);
  std::vector<std::thread> threads;
  std::atomic<bool> go{false};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      auto r = store->CompareAndSet("leader", "", absl::StrCat("rank-", t));
      seen[static_cast<size_t>(t)] = r.ok() ? *r : "error";
    });
  }
  go.store(true);
  for (std::thread& t : threads) t.join();
  const std::string winner = *store->Get("leader", absl::ZeroDuration());
  int wins = 0;
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(seen[static_cast<size_t>(t)], winner) << "thread " << t;
    if (winner == absl::StrCat("rank-", t)) ++wins;
  }
  EXPECT_EQ(wins, 1);
}

// ---------------------------------------------------------------- prefix view

TEST(PrefixStore, TwoPrefixesDoNotSeeEachOthersKeys) {
  TempDir dir;
  auto base = MustOpen(dir.Uri());
  auto gen1 = MakePrefixStore(*base, "gen/1");
  auto gen2 = MakePrefixStore(*base, "gen/2");

  ASSERT_TRUE(gen1->Set("addr", "one").ok());
  ASSERT_TRUE(gen2->Set("addr", "two").ok());
  EXPECT_EQ(*gen1->Get("addr", absl::ZeroDuration()), "one");
  EXPECT_EQ(*gen2->Get("addr", absl::ZeroDuration()), "two");
  EXPECT_EQ(*base->Get("gen/1/addr", absl::ZeroDuration()), "one");
  EXPECT_FALSE(base->TryGet("addr")->has_value());

  EXPECT_EQ(*gen1->Add("n", 2), 2);
  EXPECT_FALSE(gen2->TryGet("n")->has_value());
  EXPECT_EQ(*gen2->CompareAndSet("n", "", "x"), "x");
  EXPECT_EQ(*gen1->Add("n", 1), 3);

  EXPECT_TRUE(*gen1->Delete("addr"));
  EXPECT_EQ(*gen2->Get("addr", absl::ZeroDuration()), "two");

  // Nested views compose, and timeouts name the full key.
  auto nested = MakePrefixStore(*gen2, "sub");
  ASSERT_TRUE(nested->Set("k", "v").ok());
  EXPECT_EQ(*base->Get("gen/2/sub/k", absl::ZeroDuration()), "v");
  absl::Status st = nested->Wait({"k", "missing"}, absl::Milliseconds(20));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(std::string(st.message()), "gen/2/sub/missing")) << st;
}

// ---------------------------------------------------------------- errors

TEST(FileStore, InvalidKeysAreRejectedNamingTheKey) {
  TempDir dir;
  auto store = MustOpen(dir.Uri());
  for (const std::string& key : {std::string("has space"), std::string("semi;colon"),
                                 std::string("percent%"), std::string("new\nline")}) {
    absl::Status st = store->Set(key, "v");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_TRUE(Contains(std::string(st.message()), key.substr(0, 3))) << st;
    EXPECT_EQ(store->TryGet(key).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(store->Get(key, absl::Seconds(5)).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(store->Add(key, 1).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(store->CompareAndSet(key, "", "v").status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(store->Delete(key).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(store->Wait({"ok", key}, absl::Seconds(5)).code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(store->Set("", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Set(std::string(201, 'a'), "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(store->Set(std::string(200, 'a'), "v").ok());

  auto view = MakePrefixStore(*store, "p");
  EXPECT_EQ(view->Set("bad key", "v").code(), absl::StatusCode::kInvalidArgument);
  auto bad_prefix = MakePrefixStore(*store, "bad prefix");
  absl::Status st = bad_prefix->Set("k", "v");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(std::string(st.message()), "bad prefix/k")) << st;
}

TEST(OpenStore, RejectsBadUrisWithClearErrors) {
  auto tcp = OpenStore("tcp://localhost:29500");
  EXPECT_EQ(tcp.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(Contains(std::string(tcp.status().message()), "tcp")) << tcp.status();

  for (const std::string uri :
       {"zk://host:2181", "/abs/path", "", "file://relative/dir", "file://", "://x"}) {
    auto s = OpenStore(uri);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << uri;
    if (!uri.empty()) {
      EXPECT_TRUE(Contains(std::string(s.status().message()), uri)) << s.status();
    }
  }
}

TEST(OpenStore, CreatesAMissingDirectory) {
  TempDir dir;
  const std::string nested = dir.path() + "/a/b/store";
  auto store = MustOpen("file://" + nested);
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->Set("k", "v").ok());
  EXPECT_TRUE(fs::is_directory(nested));
}

TEST(OpenStore, UnwritableDirectoryFailsNamingIt) {
  TempDir dir;
  const std::string ro = dir.path() + "/ro";
  fs::create_directories(ro);
  ::chmod(ro.c_str(), 0555);
  ::chmod(dir.path().c_str(), 0755);
  // Root ignores permission bits: try as nobody in a child when root.
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  const pid_t pid = Fork([&] {
    ::close(p[0]);
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) return 3;
    std::string report;
    for (const std::string& path : {ro, ro + "/inner"}) {
      auto s = OpenStore("file://" + path);
      if (s.ok()) return 4;
      report += absl::StrCat(static_cast<int>(s.status().code()), "|", s.status().message(), "\n");
    }
    return ::write(p[1], report.data(), report.size()) == static_cast<ssize_t>(report.size()) ? 0
                                                                                              : 5;
  });
  ::close(p[1]);
  std::string report;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(p[0], buf, sizeof(buf))) > 0) report.append(buf, static_cast<size_t>(n));
  ::close(p[0]);
  ASSERT_TRUE(ExitedZero(pid)) << report;
  const std::string denied = absl::StrCat(static_cast<int>(absl::StatusCode::kPermissionDenied));
  const auto nl = report.find('\n');
  ASSERT_NE(nl, std::string::npos) << report;
  const std::string first = report.substr(0, nl);
  const std::string second = report.substr(nl + 1);
  EXPECT_EQ(first.rfind(denied + "|", 0), 0u) << first;
  EXPECT_TRUE(Contains(first, ro)) << first;
  EXPECT_EQ(second.rfind(denied + "|", 0), 0u) << second;
  EXPECT_TRUE(Contains(second, ro + "/inner")) << second;
}

}  // namespace
}  // namespace omni
