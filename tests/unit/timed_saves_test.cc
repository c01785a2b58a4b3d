// The Runtime's checkpoints by wall time (src/facade/timed_saves.h): one
// replica's interval on a fake clock, and the replicas' agreement on the
// boundary over a real FileStore.
#include "facade/timed_saves.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "omni/clock.h"
#include "omni/store.h"
#include "temp_dir.h"

namespace omni::internal {
namespace {

using test_util::TempDir;

std::unique_ptr<Store> OpenDirStore(const std::string& dir) {
  auto s = OpenStore("file://" + dir);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

TEST(SaveTimer, IsDueOnceTheIntervalHasPassedSinceItsLastRestart) {
  FakeClock clock;
  SaveTimer t(absl::Milliseconds(100), &clock);
  clock.Advance(std::chrono::milliseconds(99));
  EXPECT_FALSE(t.Due());
  clock.Advance(std::chrono::milliseconds(1));
  EXPECT_TRUE(t.Due());
  t.RestartAt(clock.NowNanos());
  EXPECT_FALSE(t.Due());
  clock.Advance(std::chrono::milliseconds(150));
  EXPECT_TRUE(t.Due());
}

TEST(SaveAgreement, TheFirstDueReplicaProposesTheNextBoundaryAndBothSaveThere) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  SaveAgreement a(*store), b(*store);
  // b has passed boundary 6 before a's interval passed there.
  EXPECT_FALSE(*b.AtBoundary(6, /*due=*/false));
  EXPECT_FALSE(*a.AtBoundary(6, /*due=*/true));  // proposes the boundary after step 7
  EXPECT_TRUE(*b.AtBoundary(7, /*due=*/false)) << "b saves where a proposed";
  EXPECT_TRUE(*a.AtBoundary(7, /*due=*/true));
  // The next timed save is another key: nothing is pending until one is due.
  EXPECT_FALSE(*a.AtBoundary(8, false));
  EXPECT_FALSE(*b.AtBoundary(8, false));
  EXPECT_FALSE(*b.AtBoundary(9, /*due=*/true));  // now b proposes 10
  EXPECT_FALSE(*a.AtBoundary(9, false));
  EXPECT_TRUE(*a.AtBoundary(10, false));
  EXPECT_TRUE(*b.AtBoundary(10, false));
}

TEST(SaveAgreement, AMalformedRecordOrAReplicaPastTheBoundaryIsAnError) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  ASSERT_TRUE(store->Set("0", "soon").ok());
  SaveAgreement a(*store);
  absl::StatusOr<bool> d = a.AtBoundary(3, true);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("'0'"), absl::string_view::npos) << d.status();
  EXPECT_NE(d.status().message().find("soon"), absl::string_view::npos) << d.status();

  TempDir dir2;
  auto store2 = OpenDirStore(dir2.path());
  SaveAgreement first(*store2), late(*store2);
  ASSERT_TRUE(first.AtBoundary(10, true).ok());  // agreed: after step 11
  d = late.AtBoundary(12, false);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(d.status().message().find("lockstep"), absl::string_view::npos) << d.status();
}

}  // namespace
}  // namespace omni::internal
