// The etcd:// backend against real etcd members started on loopback (Debian's
// etcd-server; skipped when /usr/bin/etcd is missing or the build has no
// libcurl).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "omni/config.h"
#include "omni/membership.h"
#include "omni/store.h"

namespace omni {
namespace {

namespace fs = std::filesystem;
constexpr char kEtcd[] = "/usr/bin/etcd";

uint16_t FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// `n` etcd members on loopback, one process each, killed on destruction.
class Cluster {
 public:
  explicit Cluster(int n) {
    std::string t = (fs::temp_directory_path() / "omni_etcd_XXXXXX").string();
    dir_ = mkdtemp(t.data());
    std::vector<std::string> peers;
    for (int i = 0; i < n; ++i) {
      client_.push_back(FreePort());
      peer_.push_back(FreePort());
      peers.push_back(absl::StrCat("m", i, "=http://127.0.0.1:", peer_.back()));
    }
    const std::string initial = absl::StrJoin(peers, ",");
    for (int i = 0; i < n; ++i) {
      const std::string name = absl::StrCat("m", i);
      const std::string client = absl::StrCat("http://127.0.0.1:", client_[i]);
      const std::string peer = absl::StrCat("http://127.0.0.1:", peer_[i]);
      const std::string data = absl::StrCat(dir_, "/", name);
      const std::string log = absl::StrCat(dir_, "/", name, ".log");
      const pid_t pid = ::fork();
      if (pid == 0) {
        FILE* f = std::freopen(log.c_str(), "w", stderr);
        (void)f;
        ::execl(kEtcd, kEtcd, "--name", name.c_str(), "--data-dir", data.c_str(),
                "--listen-client-urls", client.c_str(), "--advertise-client-urls", client.c_str(),
                "--listen-peer-urls", peer.c_str(), "--initial-advertise-peer-urls", peer.c_str(),
                "--initial-cluster", initial.c_str(), "--initial-cluster-state", "new",
                "--initial-cluster-token", dir_.c_str(), static_cast<char*>(nullptr));
        ::_exit(127);
      }
      pids_.push_back(pid);
    }
  }
  ~Cluster() {
    for (size_t i = 0; i < pids_.size(); ++i) Kill(static_cast<int>(i));
    fs::remove_all(dir_);
  }
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  std::string Uri() const {
    std::vector<std::string> eps;
    for (uint16_t p : client_) eps.push_back(absl::StrCat("127.0.0.1:", p));
    return "etcd://" + absl::StrJoin(eps, ",");
  }
  void Kill(int i) {
    if (pids_[static_cast<size_t>(i)] <= 0) return;
    ::kill(pids_[static_cast<size_t>(i)], SIGKILL);
    ::waitpid(pids_[static_cast<size_t>(i)], nullptr, 0);
    pids_[static_cast<size_t>(i)] = -1;
  }
  // A store once a write goes through (the cluster has a leader), or null.
  std::unique_ptr<Store> Open() const {
    const absl::Time until = absl::Now() + absl::Seconds(30);
    while (absl::Now() < until) {
      absl::StatusOr<std::unique_ptr<Store>> s = OpenStore(Uri());
      if (!s.ok()) {
        ADD_FAILURE() << s.status();
        return nullptr;
      }
      if ((*s)->Set("ready", "1").ok()) return *std::move(s);
      absl::SleepFor(absl::Milliseconds(100));
    }
    ADD_FAILURE() << "etcd at " << Uri() << " did not become ready";
    return nullptr;
  }

 private:
  std::string dir_;
  std::vector<uint16_t> client_, peer_;
  std::vector<pid_t> pids_;
};

bool CanRun() { return OMNI_HAVE_ETCD && ::access(kEtcd, X_OK) == 0; }

TEST(EtcdStore, KeepsTheStoreContract) {
  if (!CanRun()) GTEST_SKIP() << "needs libcurl at build time and " << kEtcd;
  Cluster cluster(1);
  auto store = cluster.Open();
  ASSERT_TRUE(store);
  EXPECT_FALSE(store->TryGet("a/b")->has_value());
  ASSERT_TRUE(store->Set("a/b", std::string("v\0w", 3)).ok());
  EXPECT_EQ(store->TryGet("a/b")->value_or(""), std::string("v\0w", 3));
  ASSERT_TRUE(store->Set("empty", "").ok());
  EXPECT_EQ(store->TryGet("empty")->value_or("x"), "");
  EXPECT_EQ(store->Delete("a/b").value_or(false), true);
  EXPECT_EQ(store->Delete("a/b").value_or(true), false);

  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      auto mine = OpenStore(cluster.Uri());
      ASSERT_TRUE(mine.ok());
      for (int i = 0; i < 10; ++i) ASSERT_TRUE((*mine)->Add("n", 1).ok());
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(store->Add("n", 0).value_or(-1), 40);
  EXPECT_TRUE(absl::IsInvalidArgument(store->Add("empty", 1).status()));

  EXPECT_EQ(store->CompareAndSet("k", "", "one").value_or(""), "one");
  EXPECT_EQ(store->CompareAndSet("k", "", "two").value_or(""), "one");
  EXPECT_EQ(store->CompareAndSet("k", "x", "two").value_or(""), "one");
  EXPECT_EQ(store->CompareAndSet("k", "one", "two").value_or(""), "two");
  EXPECT_TRUE(absl::IsNotFound(store->CompareAndSet("missing", "x", "y").status()));
  EXPECT_TRUE(absl::IsDeadlineExceeded(store->Get("never", absl::Milliseconds(20)).status()));
}

TEST(EtcdStore, RejectsBadUrisNamingThem) {
  if (!OMNI_HAVE_ETCD) GTEST_SKIP() << "built without libcurl";
  for (const char* uri : {"etcd://", "etcd://host", "etcd://host:0", "etcd://h:1/path",
                          "etcd://127.0.0.1:2379?bogus=1"}) {
    absl::StatusOr<std::unique_ptr<Store>> s = OpenStore(uri);
    EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << uri << ": " << s.status();
  }
}

// Issue 13, item 7: the store survives the loss of a member (and of the
// replica that started first: no replica hosts it).
TEST(EtcdStore, MembersGoOnWhenOneOfThreeEtcdMembersIsKilled) {
  if (!CanRun()) GTEST_SKIP() << "needs libcurl at build time and " << kEtcd;
  Cluster cluster(3);
  auto store = cluster.Open();
  ASSERT_TRUE(store);
  MembershipOptions o;
  o.job_id = "job";
  o.self.id = "a";
  o.heartbeat = absl::Milliseconds(50);
  // Killing a member can cost the cluster its leader: the others wait an
  // election timeout (1 s by default), then vote, and on a loaded 2-core
  // machine that has taken over 2 s. No write goes through meanwhile, so the
  // peer timeout leaves room for it, and the members go on for longer than
  // the timeout afterwards, so that heartbeats that stopped for good would
  // show as dead peers.
  o.peer_timeout = absl::Seconds(5);
  o.settle = absl::Milliseconds(100);
  o.store_retry = absl::Seconds(10);
  o.min_replicas = 2;
  o.join_timeout = absl::Seconds(30);
  auto a = Membership::Create(*store, o);
  ASSERT_TRUE(a.ok()) << a.status();
  o.self.id = "b";
  auto b = Membership::Create(*store, o);
  ASSERT_TRUE(b.ok()) << b.status();
  std::thread tb([&] { ASSERT_TRUE((*b)->Join().ok()); });
  ASSERT_TRUE((*a)->Join().ok());
  tb.join();
  cluster.Kill(0);  // the first endpoint of the URI
  const absl::Time killed = absl::Now();
  for (int64_t step = 1; absl::Now() - killed < o.peer_timeout + absl::Seconds(2); ++step) {
    for (auto* m : {a->get(), b->get()}) {
      absl::StatusOr<std::optional<Generation>> next = m->AtBoundary(step);
      ASSERT_TRUE(next.ok()) << next.status();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE((*a)->StoreFailure().ok()) << (*a)->StoreFailure();
  EXPECT_TRUE((*a)->DeadPeers().empty());
  EXPECT_EQ((*a)->current().number, (*b)->current().number);
}

// Heartbeats as leases: a key written with SetWithLease stays while its
// writer renews it and vanishes by itself once the writer stops.
TEST(EtcdStore, ALeasedKeyStaysWhileRenewedAndVanishesWhenItsWriterStops) {
  if (!CanRun()) GTEST_SKIP() << "needs libcurl at build time and " << kEtcd;
  Cluster cluster(1);
  auto store = cluster.Open();
  ASSERT_TRUE(store);
  EXPECT_TRUE(store->has_leases());
  ASSERT_TRUE(store->Set("plain", "stays").ok());
  const absl::Duration ttl = absl::Seconds(1);  // etcd rounds it up to its minimum
  const absl::Time start = absl::Now();
  for (int i = 0; absl::Now() - start < absl::Seconds(4); ++i) {
    ASSERT_TRUE(store->SetWithLease("hb/a", absl::StrCat("s:", i), ttl).ok());
    ASSERT_TRUE(store->TryGet("hb/a")->has_value()) << "lost while renewed, after " << i;
    absl::SleepFor(absl::Milliseconds(200));
  }
  const absl::Time stopped = absl::Now();
  absl::Duration vanished = absl::InfiniteDuration();
  while (absl::Now() - stopped < absl::Seconds(15)) {
    if (!store->TryGet("hb/a")->has_value()) {
      vanished = absl::Now() - stopped;
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_LT(vanished, absl::Seconds(15)) << "the leased key outlived its writer";
  std::printf("leased key vanished %.2f s after its last renewal\n",
              absl::ToDoubleSeconds(vanished));
  EXPECT_EQ(store->TryGet("plain")->value_or(""), "stays");
  // Writing it again takes a new lease: the key is back and stays.
  ASSERT_TRUE(store->SetWithLease("hb/a", "again", ttl).ok());
  EXPECT_EQ(store->TryGet("hb/a")->value_or(""), "again");
}

TEST(EtcdStore, OfConcurrentGenerationProposalsExactlyOneIsStored) {
  if (!CanRun()) GTEST_SKIP() << "needs libcurl at build time and " << kEtcd;
  Cluster cluster(1);
  auto store = cluster.Open();
  ASSERT_TRUE(store);
  std::vector<std::string> seen(6);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < seen.size(); ++t) {
    threads.emplace_back([&, t] {
      auto mine = OpenStore(cluster.Uri());
      ASSERT_TRUE(mine.ok());
      auto r = (*mine)->CompareAndSet("gen/5", "", absl::StrCat("proposal-", t));
      ASSERT_TRUE(r.ok()) << r.status();
      seen[t] = *r;
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::string& s : seen) EXPECT_EQ(s, seen[0]);
  EXPECT_EQ(store->TryGet("gen/5")->value_or(""), seen[0]);
}

TEST(EtcdStore, AKilledMembersHeartbeatKeyVanishesAndTheOthersSeeItDead) {
  if (!CanRun()) GTEST_SKIP() << "needs libcurl at build time and " << kEtcd;
  Cluster cluster(1);
  auto store = cluster.Open();
  ASSERT_TRUE(store);
  MembershipOptions o;
  o.job_id = "job";
  o.heartbeat = absl::Milliseconds(50);
  o.peer_timeout = absl::Seconds(2);
  o.settle = absl::Milliseconds(100);
  o.min_replicas = 2;
  o.join_timeout = absl::Seconds(30);
  auto prefix = MakePrefixStore(*store, "job");
  o.self.id = "a";
  auto a = Membership::Create(*prefix, o);
  ASSERT_TRUE(a.ok()) << a.status();
  auto other = OpenStore(cluster.Uri());  // b's own connection and leases
  ASSERT_TRUE(other.ok());
  auto other_prefix = MakePrefixStore(**other, "job");
  o.self.id = "b";
  auto b = Membership::Create(*other_prefix, o);
  ASSERT_TRUE(b.ok()) << b.status();
  std::thread tb([&] { ASSERT_TRUE((*b)->Join().ok()); });
  ASSERT_TRUE((*a)->Join().ok());
  tb.join();
  ASSERT_TRUE(store->TryGet("job/hb/b")->has_value());
  b->reset();  // b's heartbeats stop, as when its process is killed
  const absl::Time t0 = absl::Now();
  while (store->TryGet("job/hb/b")->has_value() && absl::Now() - t0 < absl::Seconds(15)) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_FALSE(store->TryGet("job/hb/b")->has_value());
  while ((*a)->DeadPeers().empty() && absl::Now() - t0 < absl::Seconds(15)) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ((*a)->DeadPeers(), std::vector<std::string>{"b"});
}

}  // namespace
}  // namespace omni
