// The checkpoint manager on another FileSystem (private: for the
// fault-injection tests, tests/unit/checkpoint_fault_test.cc).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "ckpt/direct_writer.h"
#include "common/fs.h"
#include "omni/checkpoint.h"
#include "omni/export.h"

namespace omni::internal {

// As CheckpointManager::Open, with every file operation of the manager going
// through `fs`, which must outlive it, and shards written with `direct`
// (smaller blocks let a test cover several direct writes with a small state;
// options.direct_io false still turns direct I/O off).
OMNI_EXPORT absl::StatusOr<std::unique_ptr<CheckpointManager>> OpenCheckpointManagerOn(
    const CheckpointOptions& options, FileSystem& fs,
    const ckpt::DirectIoOptions& direct = ckpt::DirectIoOptions());

}  // namespace omni::internal
