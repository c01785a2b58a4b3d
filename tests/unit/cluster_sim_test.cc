#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "cluster_sim_model.h"

namespace omni::clustersim {
namespace {

namespace fs = std::filesystem;
using colocate::JobClass;

// An omni.steplog header with the built-in phases.
constexpr const char* kHeader =
    R"({"type":"header","schema":"omni.steplog","version":1,"source":"test",)"
    R"("clock":"CLOCK_MONOTONIC","phases":[{"id":0,"idle":"data_stall","name":"data_wait"},)"
    R"({"id":1,"idle":"busy","name":"compute"},{"id":2,"idle":"busy","name":"comm"},)"
    R"({"id":3,"idle":"busy","name":"optimizer"},{"id":4,"idle":"checkpoint","name":"checkpoint"},)"
    R"({"id":5,"idle":"eval","name":"eval"},)"
    R"({"id":6,"idle":"pipeline_bubble","name":"pipeline_bubble"},)"
    R"({"id":7,"idle":"host_side","name":"host"}]})";

// A step log with a 100 ms eval window every 10th step (10 ms busy steps).
std::string WriteEvalLog(const fs::path& dir) {
  const fs::path p = dir / "eval_every_10.jsonl";
  std::ofstream f(p);
  f << kHeader << "\n";
  int64_t t = 0;
  const int64_t ms = 1'000'000;
  for (int s = 0; s < 200; ++s) {
    const int64_t start = t;
    f << R"({"type":"step","step":)" << s << R"(,"start_ns":)" << start << R"(,"end_ns":)";
    const bool eval = s % 10 == 9;
    const int64_t end = start + 10 * ms + (eval ? 100 * ms : 0);
    f << end << R"(,"kind":")" << (eval ? "eval" : "normal") << R"(","spans":[)"
      << R"({"phase":"compute","start_ns":)" << start << R"(,"end_ns":)" << start + 10 * ms
      << R"(,"depth":0})";
    if (eval) {
      f << R"(,{"phase":"eval","start_ns":)" << start + 10 * ms << R"(,"end_ns":)" << end
        << R"(,"depth":0})";
    }
    f << "]}\n";
    t = end;
  }
  return p.string();
}

class ClusterSimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "omni_cluster_sim_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// The live notices claim nothing until 3 windows of a phase are measured
// (NoticeReplayOptions::min_samples), then each 100 ms eval in full.
TEST_F(ClusterSimTest, ReplayHarvestsWhatTheGateAllowsInEachWindowTheNoticesClaim) {
  ReplayOptions o;
  o.guest_unit_ns = 10'000'000;  // 10 ms units, 1 ms guard, 100 ms windows: 9 units each
  o.guard_ns = 1'000'000;
  o.use_forecasts = false;
  absl::StatusOr<StepProfile> p = ReplayStepLog(WriteEvalLog(dir_), o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->windows, 20);
  EXPECT_EQ(p->guest_units, 17 * 9);
  EXPECT_NEAR(p->harvest_fraction, 17 * 9 * 10.0 / 2000.0, 1e-9);
  EXPECT_NEAR(p->idle_fraction, 2000.0 / (2000.0 + 2000.0), 1e-9);
  EXPECT_EQ(p->deadline_misses, 0);
  EXPECT_EQ(p->host_slowdown, 0);
}

// A guest that reads the forecasts too works in an eval the forecast claims
// before the notices claim any (the forecaster claims an event from its
// second occurrence, the notices from their fourth window), and nowhere the
// host is busy.
TEST_F(ClusterSimTest, ReplayWithTheForecastsAlsoHarvestsTheWindowsTheyClaimFirst) {
  ReplayOptions o;
  o.guest_unit_ns = 10'000'000;
  o.guard_ns = 1'000'000;
  absl::StatusOr<StepProfile> p = ReplayStepLog(WriteEvalLog(dir_), o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_GT(p->guest_units, 17 * 9);
  EXPECT_LE(p->guest_units, 19 * 9);
  EXPECT_NEAR(p->harvest_fraction, static_cast<double>(p->guest_units) * 10.0 / 2000.0, 1e-9);
  EXPECT_EQ(p->deadline_misses, 0);
  EXPECT_EQ(p->host_slowdown, 0);
}

TEST_F(ClusterSimTest, ReplayRejectsAMalformedLineNamingFileAndLine) {
  const fs::path p = dir_ / "bad.jsonl";
  std::ofstream(p) << kHeader << "\nnot json\n";
  absl::StatusOr<StepProfile> r = ReplayStepLog(p.string(), {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("bad.jsonl:2"), std::string::npos) << r.status();
}

TEST_F(ClusterSimTest, TheShippedStepLogsReplay) {
  absl::StatusOr<std::vector<StepProfile>> ps = LoadProfiles(OMNI_TEST_DATA_DIR, {});
  ASSERT_TRUE(ps.ok()) << ps.status();
  ASSERT_FALSE(ps->empty());
  for (const StepProfile& p : *ps) {
    EXPECT_GT(p.idle_fraction, 0) << p.name;
    EXPECT_GE(p.harvest_fraction, 0) << p.name;
    EXPECT_LE(p.harvest_fraction, 1) << p.name;
  }
}

std::vector<StepProfile> TwoProfiles() {
  StepProfile a;
  a.name = "a";
  a.idle_fraction = 0.3;
  a.harvest_fraction = 0.8;
  a.host_slowdown = 0.001;
  StepProfile b = a;
  b.name = "b";
  b.idle_fraction = 0.1;
  b.harvest_fraction = 0.0;
  return {a, b};
}

SimOptions Tiny() {
  SimOptions o;
  o.devices = 16;
  o.warmup_s = 0.5 * 86400;
  o.window_s = 2 * 86400;
  o.drain_s = 8 * 86400;
  return o;
}

std::vector<JobSpec> TinyJobs(uint64_t seed) {
  WorkloadOptions w;
  w.devices = 16;
  w.warmup_days = 0.5;
  w.days = 2;
  w.seed = seed;
  w.load_factor = 3;
  return GenerateJobs(w, 2);
}

TEST_F(ClusterSimTest, DeviceHoursAreConservedUnderEveryPolicy) {
  const std::vector<JobSpec> jobs = TinyJobs(7);
  ASSERT_GT(jobs.size(), 20u);
  for (SimPolicy k : {SimPolicy::kStatic, SimPolicy::kKillRequeue, SimPolicy::kColocate}) {
    absl::StatusOr<SimResult> r = Simulate(jobs, TwoProfiles(), k, Tiny());
    ASSERT_TRUE(r.ok()) << r.status();
    SCOPED_TRACE(SimPolicyName(k));
    const double cap = 16.0 * 2 * 86400;
    EXPECT_DOUBLE_EQ(r->capacity_device_s, cap);
    // Held + free = capacity, and the pool's integral equals the jobs' sum.
    EXPECT_NEAR(r->held_device_s + r->free_device_s, cap, 1e-6 * cap);
    EXPECT_NEAR(r->held_by_jobs_device_s, r->held_device_s, 1e-6 * cap);
    EXPECT_GT(r->held_device_s, 0);
    // Useful work fits in what was held (busy share ≤ 1), plus the harvest.
    EXPECT_LE(r->useful_device_s, r->held_device_s + 1e-6 * cap);
    EXPECT_LE(r->utilization, 1.0);
    if (k != SimPolicy::kColocate) {
      EXPECT_EQ(r->harvested_device_s, 0);
      EXPECT_EQ(r->guest_attaches, 0);
    }
    if (k == SimPolicy::kStatic) {
      EXPECT_EQ(r->preemptions, 0);
      EXPECT_EQ(r->lost_work_h, 0);
    }
  }
}

TEST_F(ClusterSimTest, ResultsAreReproducibleFromTheSeed) {
  auto run = [&](uint64_t seed) {
    absl::StatusOr<SimResult> r =
        Simulate(TinyJobs(seed), TwoProfiles(), SimPolicy::kColocate, Tiny());
    EXPECT_TRUE(r.ok()) << r.status();
    return *r;
  };
  const SimResult a = run(11);
  const SimResult b = run(11);
  const SimResult c = run(12);
  EXPECT_EQ(a.events, b.events);
  EXPECT_EQ(a.utilization, b.utilization);
  EXPECT_EQ(a.critical_slowdown_pct, b.critical_slowdown_pct);
  EXPECT_EQ(a.regular_jct_h, b.regular_jct_h);
  EXPECT_EQ(a.lost_work_h, b.lost_work_h);
  EXPECT_NE(a.utilization, c.utilization);  // another seed, another trace
}

TEST_F(ClusterSimTest, ColocationHarvestsCriticalIdleTimeAndNeverPreemptsARegularJobEarly) {
  // One critical job with 30% idle time, a best-effort guest that only fits
  // in its windows, and a young regular job a critical arrival cannot take.
  std::vector<JobSpec> jobs(4);
  jobs[0] = {0, 0, 8, 40000, JobClass::kCritical, 0};
  jobs[1] = {1, 1, 8, 3600, JobClass::kRegular, 0};
  jobs[2] = {2, 2, 4, 3600, JobClass::kBestEffort, 0};
  jobs[3] = {3, 100, 8, 3600, JobClass::kCritical, 0};
  SimOptions o = Tiny();
  o.warmup_s = 0;
  absl::StatusOr<SimResult> r = Simulate(jobs, TwoProfiles(), SimPolicy::kColocate, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->guest_attaches, 1);
  // The guest ran 3600 s of work at 0.3 · 0.8 of its host's time.
  EXPECT_NEAR(r->harvested_device_s, 4 * 0.7 * 3600, 1);
  // The regular job ran its hour (< min_run of 2 h): never preempted; the
  // second critical job waited for it.
  EXPECT_EQ(r->preemptions, 0);
  EXPECT_EQ(r->starved, 0);
  EXPECT_GT(r->critical_slowdown_pct, 0);
}

TEST_F(ClusterSimTest, SimulateRejectsAJobLargerThanThePool) {
  std::vector<JobSpec> jobs = {{0, 0, 32, 10, JobClass::kRegular, 0}};
  EXPECT_EQ(Simulate(jobs, TwoProfiles(), SimPolicy::kStatic, Tiny()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace omni::clustersim
