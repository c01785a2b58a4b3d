#include "omni/colocate_policy.h"

#include <gtest/gtest.h>

#include <vector>

namespace omni::colocate {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kSec = 1000 * kMs;
constexpr int64_t kMin = 60 * kSec;
constexpr int64_t kHour = 60 * kMin;

class PolicyTest : public ::testing::Test {
 protected:
  std::unique_ptr<Policy> Make(PolicyOptions o = {}) {
    auto p = Policy::Create(o, &clock_);
    EXPECT_TRUE(p.ok()) << p.status();
    return *std::move(p);
  }
  int64_t now() const { return clock_.NowNanos(); }
  FakeClock clock_{100 * kHour};
};

JobView Job(uint64_t id, JobClass c, int devices, int64_t since, int64_t ckpt,
            YieldBounds b = {kSec, 30 * kSec}) {
  JobView j;
  j.id = id;
  j.job_class = c;
  j.devices = devices;
  j.running_since_ns = since;
  j.last_checkpoint_ns = ckpt;
  j.bounds = b;
  return j;
}

TEST_F(PolicyTest, CreateRejectsBadOptionsNamingTheField) {
  PolicyOptions o;
  o.min_confidence = 1.5;
  EXPECT_NE(Policy::Create(o, &clock_).status().message().find("min_confidence"),
            std::string::npos);
  o = {};
  o.min_run = absl::Seconds(-1);
  EXPECT_NE(Policy::Create(o, &clock_).status().message().find("min_run"), std::string::npos);
  o = {};
  o.slack = -0.1;
  EXPECT_NE(Policy::Create(o, &clock_).status().message().find("slack"), std::string::npos);
  EXPECT_FALSE(Policy::Create({}, nullptr).ok());
}

// Rule 2: reserved windows from forecasts.
TEST_F(PolicyTest, LeaseBeforeOpeningCoversOnlyWhatIsIdleWhateverTheActualStart) {
  auto p = Make();
  IdleWindowForecast w{now() + 10 * kSec, now() + 12 * kSec, 5 * kSec, 6 * kSec, 0.95};
  auto lease = p->LeaseFor(w, std::nullopt);
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(lease->open_ns, now() + 12 * kSec);             // latest start
  EXPECT_EQ(lease->close_ns, now() + 15 * kSec - 5 * kMs);  // earliest start + guaranteed − guard
}

TEST_F(PolicyTest, LeaseAfterALiveOpenNoticeRunsFromTheOpenForTheGuaranteedDuration) {
  auto p = Make();
  IdleWindowForecast w{now() - kSec, now() + 2 * kSec, 5 * kSec, 6 * kSec, 0.95};
  auto lease = p->LeaseFor(w, now() - 200 * kMs);
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(lease->open_ns, now());  // never before now
  EXPECT_EQ(lease->close_ns, now() - 200 * kMs + 5 * kSec - 5 * kMs);
}

TEST_F(PolicyTest, NoLeaseForALowConfidenceWindowOrOneTooUncertainToOverlapItself) {
  auto p = Make();
  EXPECT_FALSE(p->LeaseFor({now(), now(), 5 * kSec, 5 * kSec, 0.8}, std::nullopt).has_value());
  // Start uncertain by 6 s, guaranteed 5 s: no instant is surely idle.
  EXPECT_FALSE(
      p->LeaseFor({now(), now() + 6 * kSec, 5 * kSec, 5 * kSec, 0.99}, std::nullopt).has_value());
  // Already over.
  EXPECT_FALSE(
      p->LeaseFor({now() - 10 * kSec, now() - 10 * kSec, kSec, kSec, 0.99}, now() - 10 * kSec)
          .has_value());
}

// Rule 3: stand up before your station.
TEST_F(PolicyTest, NoticeBeforeAReservationLeavesTimeForOneStepAndTheSave) {
  PolicyOptions o;
  o.slack = 0.5;
  auto p = Make(o);
  const int64_t reservation = now() + 10 * kMin;
  YieldNotice n = p->NoticeBeforeReservation(reservation, {2 * kSec, 20 * kSec}, true);
  EXPECT_EQ(n.kind, NoticeKind::kByDeadline);
  EXPECT_EQ(n.deadline_ns, reservation - 5 * kMs);
  EXPECT_EQ(n.send_at_ns, n.deadline_ns - 33 * kSec);  // (2 + 20) · 1.5
  // A guest that only finishes its unit in flight is told later.
  YieldNotice g = p->NoticeBeforeReservation(reservation, {2 * kSec, 20 * kSec}, false);
  EXPECT_EQ(g.send_at_ns, g.deadline_ns - 3 * kSec);
}

TEST_F(PolicyTest, ALateReservationNoticeIsSentNowAndSaysSo) {
  auto p = Make();
  YieldNotice n = p->NoticeBeforeReservation(now() + kSec, {2 * kSec, 20 * kSec}, true);
  EXPECT_EQ(n.send_at_ns, now());
  EXPECT_NE(n.reason.find("late"), std::string::npos) << n.reason;
}

// Rule 4: the policy chooses the notice kind.
TEST_F(PolicyTest, DevicesWantedLaterGiveAByDeadlineNoticeTheJobUsesForProgress) {
  auto p = Make();
  JobView j = Job(1, JobClass::kRegular, 4, now() - 3 * kHour, now() - kMin);
  YieldNotice n = p->NoticeForPreemption(j, now() + 10 * kMin);
  EXPECT_EQ(n.kind, NoticeKind::kByDeadline);
  EXPECT_EQ(n.deadline_ns, now() + 10 * kMin);
}

TEST_F(PolicyTest, DevicesWantedNowGiveAnAsapNoticeWithASaveWhenTheSaveIsShort) {
  auto p = Make();
  JobView j = Job(1, JobClass::kRegular, 4, now() - 3 * kHour, now() - kMin);
  YieldNotice n = p->NoticeForPreemption(j, now());
  EXPECT_EQ(n.kind, NoticeKind::kAsapWithSave);
  EXPECT_EQ(n.deadline_ns, now() + (31 * kSec * 3) / 2);
}

TEST_F(PolicyTest, DevicesWantedNowAndASaveTooLongGiveALeaveNowNoticeWithoutSave) {
  PolicyOptions o;
  o.max_save_wait = absl::Seconds(10);
  auto p = Make(o);
  JobView j = Job(1, JobClass::kRegular, 4, now() - 3 * kHour, now() - kMin);
  YieldNotice n = p->NoticeForPreemption(j, now());
  EXPECT_EQ(n.kind, NoticeKind::kNowWithoutSave);
  EXPECT_EQ(n.deadline_ns, now());
  EXPECT_EQ(p->LostDeviceNs(j, now()), 4 * kMin);  // everything since its checkpoint
}

// Rule 5: anti-starvation.
TEST_F(PolicyTest, ARegularJobIsNotPreemptedBeforeItsMinimumRun) {
  auto p = Make();
  JobView young = Job(1, JobClass::kRegular, 8, now() - 2 * kHour + kSec, now() - kMin);
  EXPECT_FALSE(p->Preemptible(young));
  auto v = p->ChooseVictims({young}, 1, now());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(v.status().message().find("8 more on regular jobs within their min_run"),
            std::string::npos)
      << v.status();
  EXPECT_EQ(p->NextPreemptible({young}), now() + kSec);
  clock_.Advance(std::chrono::seconds(1));
  EXPECT_TRUE(p->Preemptible(young));
  EXPECT_TRUE(p->ChooseVictims({young}, 1, now()).ok());
}

TEST_F(PolicyTest, TheMinimumRunIsConfigurable) {
  PolicyOptions o;
  o.min_run = absl::Minutes(10);
  auto p = Make(o);
  EXPECT_TRUE(p->Preemptible(Job(1, JobClass::kRegular, 1, now() - 10 * kMin, now())));
  EXPECT_FALSE(p->Preemptible(Job(1, JobClass::kRegular, 1, now() - 9 * kMin, now())));
}

TEST_F(PolicyTest, BestEffortIsReclaimableAtAnyTimeAndCriticalNever) {
  auto p = Make();
  EXPECT_TRUE(p->Preemptible(Job(1, JobClass::kBestEffort, 1, now(), now())));
  EXPECT_FALSE(p->Preemptible(Job(2, JobClass::kCritical, 1, now() - 100 * kHour, now())));
  EXPECT_FALSE(p->NextPreemptible({Job(2, JobClass::kCritical, 1, now(), now())}).has_value());
}

TEST_F(PolicyTest, TheVictimIsTheJobThatLosesTheLeastWork) {
  PolicyOptions o;
  o.max_save_wait =
      absl::ZeroDuration();  // no saves: a preemption loses the work since the checkpoint
  auto p = Make(o);
  std::vector<JobView> running = {
      Job(1, JobClass::kRegular, 4, now() - 5 * kHour, now() - 20 * kMin),
      Job(2, JobClass::kRegular, 4, now() - 5 * kHour, now() - 2 * kMin),
      Job(3, JobClass::kRegular, 4, now() - 5 * kHour, now() - 9 * kMin),
  };
  auto v = p->ChooseVictims(running, 4, now());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->ids, std::vector<uint64_t>{2});
  EXPECT_EQ(v->lost_device_ns, 4 * 2 * kMin);
  auto two = p->ChooseVictims(running, 8, now());
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->ids, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(two->devices, 8);
}

TEST_F(PolicyTest, LossCountsDevicesSoOneSmallJobBeatsALargeOneWithLessTime) {
  PolicyOptions o;
  o.max_save_wait = absl::ZeroDuration();
  auto p = Make(o);
  std::vector<JobView> running = {
      Job(1, JobClass::kRegular, 8, now() - 5 * kHour, now() - 5 * kMin),   // 40 device-min
      Job(2, JobClass::kRegular, 1, now() - 5 * kHour, now() - 10 * kMin),  // 10 device-min
  };
  auto v = p->ChooseVictims(running, 1, now());
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->ids, std::vector<uint64_t>{2});
}

TEST_F(PolicyTest, OneJobThatFreesEnoughIsPreferredToSeveralThatLoseMore) {
  PolicyOptions o;
  o.max_save_wait = absl::ZeroDuration();
  auto p = Make(o);
  std::vector<JobView> running = {
      Job(1, JobClass::kRegular, 1, now() - 5 * kHour, now() - 10 * kMin),
      Job(2, JobClass::kRegular, 1, now() - 5 * kHour, now() - 10 * kMin),
      Job(3, JobClass::kRegular, 1, now() - 5 * kHour, now() - 10 * kMin),
      Job(4, JobClass::kRegular, 4, now() - 5 * kHour, now() - 5 * kMin),  // 20 < 40
  };
  auto v = p->ChooseVictims(running, 4, now());
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->ids, std::vector<uint64_t>{4});
}

TEST_F(PolicyTest, VictimsThatCanSaveLoseNothingAndGetAnAsapNotice) {
  auto p = Make();
  std::vector<JobView> running = {
      Job(1, JobClass::kBestEffort, 2, now() - kMin, now() - kMin),
      Job(2, JobClass::kRegular, 2, now() - 3 * kHour, now() - 30 * kMin),
  };
  auto v = p->ChooseVictims(running, 2, now());
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->ids, std::vector<uint64_t>{1});  // less work since its checkpoint
  EXPECT_EQ(v->lost_device_ns, 0);
  ASSERT_EQ(v->notices.size(), 1u);
  EXPECT_EQ(v->notices[0].kind, NoticeKind::kAsapWithSave);
}

TEST_F(PolicyTest, BestEffortJobsAreReclaimedBeforeRegularOnesEvenWhenTheyLoseMore) {
  PolicyOptions o;
  o.max_save_wait = absl::ZeroDuration();
  auto p = Make(o);
  std::vector<JobView> running = {
      Job(1, JobClass::kRegular, 4, now() - 5 * kHour, now() - kMin),
      Job(2, JobClass::kBestEffort, 2, now() - 5 * kHour, now() - 50 * kMin),
      Job(3, JobClass::kBestEffort, 2, now() - 5 * kHour, now() - 40 * kMin),
  };
  auto v = p->ChooseVictims(running, 4, now());
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->ids, (std::vector<uint64_t>{3, 2}));
}

TEST_F(PolicyTest, ChooseVictimsRejectsANonPositiveNeed) {
  auto p = Make();
  EXPECT_EQ(p->ChooseVictims({}, 0, now()).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace omni::colocate
