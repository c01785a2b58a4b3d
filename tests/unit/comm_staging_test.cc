// The NCCL backend's staging decisions (src/comm/staging.h): which memory
// goes to NCCL as it is, which is copied through the device buffer and in
// which pieces. They run here without a GPU; tests/gpu/run.sh runs the
// staged collectives themselves (CommNcclGpu.HostMemoryIsStaged...).
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "comm/staging.h"

namespace omni::internal {
namespace {

TEST(CommStaging, DeviceMemoryOfTheCommunicatorsDeviceGoesToNcclAsItIs) {
  const absl::StatusOr<bool> direct =
      UsesDirectly({MemoryType::kDevice, 3}, 3, "AllReduce", "data");
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_TRUE(*direct);
}

TEST(CommStaging, HostPinnedAndManagedMemoryAreStaged) {
  for (MemoryType t : {MemoryType::kUnregistered, MemoryType::kHost, MemoryType::kManaged}) {
    const absl::StatusOr<bool> direct = UsesDirectly({t, 0}, 0, "Broadcast", "data");
    ASSERT_TRUE(direct.ok()) << direct.status();
    EXPECT_FALSE(*direct) << static_cast<int>(t);
  }
}

TEST(CommStaging, DeviceMemoryOfAnotherDeviceIsRefusedNamingBothDevices) {
  const absl::StatusOr<bool> direct = UsesDirectly({MemoryType::kDevice, 1}, 0, "AllGather", "out");
  ASSERT_FALSE(direct.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(direct.status())) << direct.status();
  const absl::string_view m = direct.status().message();
  EXPECT_TRUE(absl::StrContains(m, "AllGather: out is memory of CUDA device 1")) << m;
  EXPECT_TRUE(absl::StrContains(m, "runs on device 0")) << m;
}

size_t Sum(const std::vector<StageChunk>& chunks) {
  size_t n = 0;
  for (const StageChunk& c : chunks) n += c.bytes;
  return n;
}

TEST(CommStaging, ChunksCoverTheBufferInOrderWithoutGapsOrOverlap) {
  const std::vector<StageChunk> c = StageChunks(1000, 1, 300);
  ASSERT_EQ(c.size(), 4u);
  size_t at = 0;
  for (const StageChunk& k : c) {
    EXPECT_EQ(k.offset, at);
    EXPECT_LE(k.bytes, 300u);
    at += k.bytes;
  }
  EXPECT_EQ(at, 1000u);
  EXPECT_EQ(c.back().bytes, 100u);
}

TEST(CommStaging, ChunksHoldWholeElements) {
  // 8-byte elements through 100 bytes: 96 per chunk, never half an element.
  const std::vector<StageChunk> c = StageChunks(size_t{8} * 50, 8, 100);
  for (const StageChunk& k : c) {
    EXPECT_EQ(k.offset % 8, 0u);
    EXPECT_EQ(k.bytes % 8, 0u);
    EXPECT_LE(k.bytes, 96u);
  }
  EXPECT_EQ(Sum(c), 400u);
}

TEST(CommStaging, AnElementWiderThanTheBufferStillMovesOneAtATime) {
  const std::vector<StageChunk> c = StageChunks(24, 8, 4);
  ASSERT_EQ(c.size(), 3u);
  for (const StageChunk& k : c) EXPECT_EQ(k.bytes, 8u);
}

TEST(CommStaging, NothingToMoveIsNoChunk) {
  EXPECT_TRUE(StageChunks(0, 4, kStageBytes).empty());
  EXPECT_TRUE(StageChunks(16, 0, kStageBytes).empty());
}

TEST(CommStaging, ASmallBufferIsOneCollective) {
  // The elastic group's digest exchange and the Runtime's loss: one chunk.
  const std::vector<StageChunk> c = StageChunks(16, 8, kStageBytes);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].offset, 0u);
  EXPECT_EQ(c[0].bytes, 16u);
}

TEST(CommStaging, GatherPiecesFitEveryRankInTheBuffer) {
  EXPECT_EQ(GatherPieceBytes(kStageBytes, 1), kStageBytes);
  EXPECT_EQ(GatherPieceBytes(kStageBytes, 8), kStageBytes / 8);
  EXPECT_LE(GatherPieceBytes(kStageBytes, 3) * 3, kStageBytes);
  // More ranks than bytes: one byte each (the buffer grows to fit).
  EXPECT_EQ(GatherPieceBytes(4, 16), 1u);
  EXPECT_EQ(GatherPieceBytes(4, 0), 4u);
}

}  // namespace
}  // namespace omni::internal
