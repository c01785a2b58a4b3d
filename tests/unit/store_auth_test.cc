// The job secret: every record of a store opened with one carries a MAC, and
// a forger who writes the raw store without the secret is refused (and the
// job goes on). The forger here is a second, plain FileStore on the same
// directory: what anyone who can reach the store (a TCP port, a shared
// directory) can do.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "omni/membership.h"
#include "omni/preemption.h"
#include "omni/store.h"

namespace omni {
namespace {

namespace fs = std::filesystem;

constexpr char kSecret[] = "correct horse battery staple, job 42";

class TempDir {
 public:
  TempDir() {
    std::string t = (fs::temp_directory_path() / "omni_auth_XXXXXX").string();
    path_ = mkdtemp(t.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string uri() const { return "file://" + path_ + "/store"; }

 private:
  std::string path_;
};

// The job's store: opened with OMNI_JOB_SECRET in the environment (as a
// launcher sets it), which OpenStore reads at the call.
std::unique_ptr<Store> OpenJobStore(const TempDir& dir) {
  ::setenv("OMNI_JOB_SECRET", kSecret, 1);
  absl::StatusOr<std::unique_ptr<Store>> s = OpenStore(dir.uri());
  ::unsetenv("OMNI_JOB_SECRET");
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

// The forger's view: the same store without the secret.
std::unique_ptr<Store> OpenRawStore(const TempDir& dir) {
  ::unsetenv("OMNI_JOB_SECRET");
  ::unsetenv("OMNI_JOB_SECRET_FILE");
  absl::StatusOr<std::unique_ptr<Store>> s = OpenStore(dir.uri());
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

MembershipOptions Opts(const std::string& id, int min_replicas = 1) {
  MembershipOptions o;
  o.job_id = "job-a";
  o.model_digest = "model-1";
  o.self.id = id;
  o.self.host = "host-" + id;
  o.min_replicas = min_replicas;
  o.max_replicas = 8;
  o.heartbeat = absl::Milliseconds(20);
  o.peer_timeout = absl::Milliseconds(250);
  o.settle = absl::Milliseconds(100);
  o.join_timeout = absl::Seconds(10);
  o.store_retry = absl::Milliseconds(300);
  return o;
}

TEST(AuthenticatedStore, RecordsRoundTripAndARawWriteIsRefusedNamingTheKey) {
  TempDir dir;
  auto job = OpenJobStore(dir);
  auto raw = OpenRawStore(dir);
  ASSERT_TRUE(job && raw);
  ASSERT_TRUE(job->Set("a/b", "value").ok());
  absl::StatusOr<std::optional<std::string>> v = job->TryGet("a/b");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->value_or("?"), "value");
  // What travels is not the bare value: it carries a MAC.
  absl::StatusOr<std::optional<std::string>> wire = raw->TryGet("a/b");
  ASSERT_TRUE(wire.ok());
  EXPECT_NE(wire->value_or(""), "value");

  ASSERT_TRUE(raw->Set("a/b", "forged").ok());
  v = job->TryGet("a/b");
  ASSERT_FALSE(v.ok());
  EXPECT_TRUE(absl::IsPermissionDenied(v.status())) << v.status();
  EXPECT_TRUE(absl::StrContains(v.status().message(), "'a/b'")) << v.status();
  absl::StatusOr<std::string> got = job->Get("a/b", absl::ZeroDuration());
  EXPECT_TRUE(absl::IsPermissionDenied(got.status())) << got.status();

  // A sealed record copied to another key is refused too (the key is MAC'd).
  ASSERT_TRUE(job->Set("c", "moved").ok());
  absl::StatusOr<std::optional<std::string>> sealed = raw->TryGet("c");
  ASSERT_TRUE(sealed.ok() && sealed->has_value());
  ASSERT_TRUE(raw->Set("d", **sealed).ok());
  EXPECT_TRUE(absl::IsPermissionDenied(job->TryGet("d").status()));
}

TEST(AuthenticatedStore, CountersAndCompareAndSetKeepTheirContract) {
  TempDir dir;
  auto job = OpenJobStore(dir);
  auto raw = OpenRawStore(dir);
  ASSERT_TRUE(job && raw);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 25; ++i) ASSERT_TRUE(job->Add("n", 1).ok());
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(job->Add("n", 0).value_or(-1), 100);
  EXPECT_EQ(job->TryGet("n")->value_or(""), "100");
  // A raw add cannot move an authenticated counter (it is not plain text).
  EXPECT_FALSE(raw->Add("n", 1).ok());

  EXPECT_EQ(job->CompareAndSet("k", "", "one").value_or(""), "one");
  EXPECT_EQ(job->CompareAndSet("k", "", "two").value_or(""), "one");
  EXPECT_EQ(job->CompareAndSet("k", "one", "two").value_or(""), "two");
  EXPECT_TRUE(absl::IsNotFound(job->CompareAndSet("missing", "x", "y").status()));
  // A forged record does not block a create-if-absent: it is replaced.
  ASSERT_TRUE(raw->Set("gen/7", "forged").ok());
  EXPECT_EQ(job->CompareAndSet("gen/7", "", "mine").value_or(""), "mine");
  EXPECT_EQ(job->TryGet("gen/7")->value_or(""), "mine");
}

TEST(AuthenticatedStore, ForgedPreemptionNoticeIsRefusedAndTheJobGoesOn) {
  TempDir dir;
  auto job = OpenJobStore(dir);
  auto raw = OpenRawStore(dir);
  ASSERT_TRUE(job && raw);
  PreemptionOptions po;
  po.signals = {};
  po.notice_store = job.get();
  po.notice_key = "notice";
  po.notice_poll = absl::Milliseconds(5);
  absl::StatusOr<std::unique_ptr<PreemptionMonitor>> monitor = PreemptionMonitor::Create(po);
  ASSERT_TRUE(monitor.ok()) << monitor.status();

  ASSERT_TRUE(raw->Set("notice", R"({"yield_in_s": 5})").ok());
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while ((*monitor)->last_notice_error().ok() && !(*monitor)->pending() && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_FALSE((*monitor)->pending()) << "a forged notice was taken";
  const absl::Status error = (*monitor)->last_notice_error();
  EXPECT_TRUE(absl::IsPermissionDenied(error)) << error;
  EXPECT_TRUE(absl::StrContains(error.message(), "'notice'")) << error;

  // The job's own scheduler (holding the secret) is still heard.
  ASSERT_TRUE(job->Set("notice", R"({"yield_in_s": 5})").ok());
  while (!(*monitor)->pending() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_TRUE((*monitor)->pending());
}

TEST(AuthenticatedStore, ForgedGenerationRecordIsRefusedAndTheMembersGoOn) {
  TempDir dir;
  auto job = OpenJobStore(dir);
  auto raw = OpenRawStore(dir);
  ASSERT_TRUE(job && raw);
  auto a = Membership::Create(*job, Opts("a", 2));
  auto b = Membership::Create(*job, Opts("b", 2));
  ASSERT_TRUE(a.ok() && b.ok());
  absl::StatusOr<Generation> gb;
  std::thread tb([&] { gb = (*b)->Join(); });
  absl::StatusOr<Generation> ga = (*a)->Join();
  tb.join();
  ASSERT_TRUE(ga.ok() && gb.ok()) << ga.status() << gb.status();
  ASSERT_EQ(ga->number, 1);

  // The forger evicts b: a generation 2 with a only, effective at once.
  ASSERT_TRUE(raw->Set("gen/2", R"({"number":2,"kind":"recover","at_step":0,)"
                                R"("members":[{"id":"a"}],"joined":[],"left":["b"]})")
                  .ok());
  ASSERT_TRUE(raw->Set("gen/latest", "2").ok());
  for (int64_t step = 1; step <= 3; ++step) {
    for (auto* m : {a->get(), b->get()}) {
      absl::StatusOr<std::optional<Generation>> next = m->AtBoundary(step);
      ASSERT_TRUE(next.ok()) << next.status();
      EXPECT_FALSE(next->has_value()) << (*next)->ToString();
    }
  }
  EXPECT_EQ((*a)->current().number, 1);
  EXPECT_EQ((*b)->current().size(), 2);

  // The members' own next generation (admitting c) replaces the forgery.
  auto c = Membership::Create(*job, Opts("c", 2));
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<Generation> gc;
  std::thread tc([&] { gc = (*c)->Join(); });
  std::optional<Generation> landed;
  for (int64_t step = 4; step < 400 && !landed.has_value(); ++step) {
    absl::StatusOr<std::optional<Generation>> na = (*a)->AtBoundary(step);
    absl::StatusOr<std::optional<Generation>> nb = (*b)->AtBoundary(step);
    ASSERT_TRUE(na.ok() && nb.ok()) << na.status() << nb.status();
    if (na->has_value()) landed = **na;
    absl::SleepFor(absl::Milliseconds(10));
  }
  tc.join();
  ASSERT_TRUE(gc.ok()) << gc.status();
  ASSERT_TRUE(landed.has_value());
  EXPECT_EQ(landed->number, 2);
  EXPECT_EQ(landed->kind, GenerationKind::kJoin);
  EXPECT_EQ(landed->size(), 3);
}

TEST(AuthenticatedStore, ForgedJoinTicketIsNotAdmitted) {
  TempDir dir;
  auto job = OpenJobStore(dir);
  auto raw = OpenRawStore(dir);
  ASSERT_TRUE(job && raw);
  auto a = Membership::Create(*job, Opts("a", 1));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*a)->Join().ok());

  // The forger registers "evil": a ticket, and a heartbeat that keeps changing.
  absl::StatusOr<int64_t> t = raw->Add("join/seq", 1);
  if (!t.ok()) {  // an authenticated counter: overwrite it
    ASSERT_TRUE(raw->Set("join/seq", "2").ok());
    t = 2;
  }
  ASSERT_TRUE(raw->Set("join/" + std::to_string(*t), R"({"id":"evil","host":"x"})").ok());
  for (int64_t step = 1; step <= 40; ++step) {
    ASSERT_TRUE(raw->Set("hb/evil", "s:" + std::to_string(step)).ok());
    absl::StatusOr<std::optional<Generation>> next = (*a)->AtBoundary(step);
    ASSERT_TRUE(next.ok()) << next.status();
    ASSERT_FALSE(next->has_value()) << (*next)->ToString();
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ((*a)->current().size(), 1);
}

TEST(OpenStore, ReadsTheJobSecretFromAFileNamedInTheUri) {
  TempDir dir;
  const std::string secret_path = dir.path() + "/secret";
  {
    std::ofstream f(secret_path);
    f << kSecret << "\n";
  }
  fs::permissions(secret_path, fs::perms::owner_read | fs::perms::owner_write);
  absl::StatusOr<std::unique_ptr<Store>> job = OpenStore(dir.uri() + "?secret_file=" + secret_path);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE((*job)->Set("k", "v").ok());
  // The same secret from the environment reads it; no secret sees a sealed record.
  auto env_job = OpenJobStore(dir);
  EXPECT_EQ(env_job->TryGet("k")->value_or(""), "v");
  EXPECT_NE(OpenRawStore(dir)->TryGet("k")->value_or(""), "v");

  EXPECT_TRUE(absl::IsInvalidArgument(
      OpenStore(dir.uri() + "?secret_file=" + dir.path() + "/missing").status()));
  {
    std::ofstream f(dir.path() + "/short");
    f << "short";
  }
  absl::StatusOr<std::unique_ptr<Store>> weak =
      OpenStore(dir.uri() + "?secret_file=" + dir.path() + "/short");
  ASSERT_FALSE(weak.ok());
  EXPECT_TRUE(absl::StrContains(weak.status().message(), "short")) << weak.status();
  EXPECT_TRUE(absl::IsInvalidArgument(OpenStore(dir.uri() + "?bogus=1").status()));
}

}  // namespace
}  // namespace omni
