#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "omni/preemption.h"
#include "omni/store.h"
#include "temp_dir.h"

namespace omni {
namespace {

namespace fs = std::filesystem;

using test_util::TempDir;

// The collective at the start of each step: nobody starts step k+1 before
// every rank has left boundary k.
class Lockstep {
 public:
  explicit Lockstep(int n) : n_(n) {}
  void Arrive() {
    std::unique_lock<std::mutex> l(mu_);
    const int gen = gen_;
    if (++waiting_ == n_) {
      waiting_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    cv_.wait(l, [&] { return gen_ != gen; });
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_ = 0, gen_ = 0;
};

BoundaryDecision Local(BoundaryAction a, const char* why = "") {
  BoundaryDecision d;
  d.action = a;
  d.reason = why;
  return d;
}

std::unique_ptr<Store> OpenDirStore(const std::string& dir) {
  auto s = OpenStore("file://" + dir);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

TEST(StopCoordinator, AllRanksStopAtTheSameBoundaryWhenOneRankIsPreempted) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  constexpr int kRanks = 3;
  Lockstep lockstep(kRanks);
  std::vector<int64_t> stopped(kRanks, -1);
  std::vector<BoundaryAction> actions(kRanks, BoundaryAction::kContinue);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      StopCoordinator coord(*store);
      for (int64_t step = 0; step < 20; ++step) {
        // Only rank 1 sees the signal, at the boundary after step 5.
        const BoundaryDecision local =
            Local(r == 1 && step >= 5 ? BoundaryAction::kSaveAndExit : BoundaryAction::kContinue,
                  "SIGTERM on rank 1");
        auto d = coord.AtBoundary(step, local);
        ASSERT_TRUE(d.ok()) << d.status();
        if (d->action != BoundaryAction::kContinue) {
          stopped[static_cast<size_t>(r)] = step;
          actions[static_cast<size_t>(r)] = d->action;
          EXPECT_NE(d->reason.find("SIGTERM on rank 1"), std::string::npos);
          lockstep.Arrive();  // the others may still be waiting at this boundary
          return;
        }
        lockstep.Arrive();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(stopped[static_cast<size_t>(r)], 6) << "rank " << r;
    EXPECT_EQ(actions[static_cast<size_t>(r)], BoundaryAction::kSaveAndExit) << "rank " << r;
  }
}

TEST(StopCoordinator, TheFirstProposalWinsWithItsAction) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  StopCoordinator a(*store), b(*store);
  auto da = a.AtBoundary(3, Local(BoundaryAction::kExitWithoutSave, "no time"));
  auto db = b.AtBoundary(3, Local(BoundaryAction::kSaveAndExit, "later"));
  ASSERT_TRUE(da.ok() && db.ok());
  EXPECT_EQ(da->action, BoundaryAction::kContinue);
  EXPECT_EQ(a.agreed_step(), 4);
  EXPECT_EQ(b.agreed_step(), 4);
  auto fa = a.AtBoundary(4, Local(BoundaryAction::kContinue));
  auto fb = b.AtBoundary(4, Local(BoundaryAction::kContinue));
  EXPECT_EQ(fa->action, BoundaryAction::kExitWithoutSave);
  EXPECT_EQ(fb->action, BoundaryAction::kExitWithoutSave);
  EXPECT_NE(fb->reason.find("no time"), std::string::npos);
}

TEST(StopCoordinator, ARankPastTheAgreedStopIsAnError) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  StopCoordinator a(*store), late(*store);
  ASSERT_TRUE(a.AtBoundary(10, Local(BoundaryAction::kSaveAndExit)).ok());
  auto d = late.AtBoundary(12, Local(BoundaryAction::kContinue));
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(d.status().message().find("lockstep"), absl::string_view::npos);
}

// Real processes, a real signal to one of them, real monitors.
TEST(StopCoordinator, ProcessesAgreeWhenOnlyOneReceivesSigterm) {
  TempDir dir;
  constexpr int kRanks = 3;
  std::vector<pid_t> pids;
  for (int r = 0; r < kRanks; ++r) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      PreemptionOptions o;
      o.grace = absl::Seconds(1);
      auto monitor = PreemptionMonitor::Create(o);
      auto store = OpenStore("file://" + dir.path());
      if (!monitor.ok() || !store.ok()) _exit(3);
      StopCoordinator coord(**store);
      const Cost save_cost{0.02, 0};
      double worst_step_s = 0;
      for (int64_t step = 0; step < 100000; ++step) {
        const int64_t t0 = Clock::Real()->NowNanos();
        usleep(3000);  // the step's work
        // Collective of the step: everyone has finished it.
        const std::string key = "arrive/" + std::to_string(step);
        if (!(*store)->Add(key, 1).ok()) _exit(4);
        for (int spin = 0;; ++spin) {
          auto n = (*store)->Add(key, 0);
          if (!n.ok() || spin > 20000) _exit(5);
          if (*n >= kRanks) break;
          usleep(200);
        }
        worst_step_s = std::max(worst_step_s, (Clock::Real()->NowNanos() - t0) / 1e9);
        // One extra step of lookahead, because the agreed stop is one later;
        // steps are costed at the worst seen (the store barrier is slow).
        const BoundaryDecision local = (*monitor)->AtBoundary({2 * worst_step_s, 0}, save_cost);
        auto d = coord.AtBoundary(step, local);
        if (!d.ok()) _exit(6);
        if (d->action != BoundaryAction::kContinue) {
          std::ofstream(dir.path() + "/stopped-" + std::to_string(r)) << step;
          _exit(d->action == BoundaryAction::kSaveAndExit ? kExitPreempted : kExitPreemptedNoSave);
        }
      }
      _exit(7);
    }
    pids.push_back(pid);
  }
  usleep(400'000);  // all ranks are training
  ASSERT_EQ(kill(pids[1], SIGTERM), 0);
  std::vector<int64_t> steps;
  for (int r = 0; r < kRanks; ++r) {
    int status = 0;
    // Bounded: the grace is 1 s; a hang would be caught by the ctest timeout
    // too, but fail fast here.
    pid_t got = 0;
    for (int i = 0; i < 2000 && got == 0; ++i) {
      got = waitpid(pids[static_cast<size_t>(r)], &status, WNOHANG);
      if (got == 0) usleep(5000);
    }
    if (got == 0) {
      for (pid_t p : pids) kill(p, SIGKILL);
      FAIL() << "rank " << r << " did not stop";
    }
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), kExitPreempted) << "rank " << r;
    std::ifstream in(dir.path() + "/stopped-" + std::to_string(r));
    int64_t s = -1;
    in >> s;
    steps.push_back(s);
  }
  EXPECT_GE(steps[0], 0);
  EXPECT_EQ(steps[0], steps[1]);
  EXPECT_EQ(steps[1], steps[2]);
}

}  // namespace
}  // namespace omni
