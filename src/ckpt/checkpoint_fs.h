// The checkpoint manager on another FileSystem (private: for the
// fault-injection tests, tests/unit/checkpoint_fault_test.cc).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/fs.h"
#include "omni/checkpoint.h"
#include "omni/export.h"

namespace omni::internal {

// As CheckpointManager::Open, with every file operation of the manager going
// through `fs`, which must outlive it.
OMNI_EXPORT absl::StatusOr<std::unique_ptr<CheckpointManager>> OpenCheckpointManagerOn(
    const CheckpointOptions& options, FileSystem& fs);

}  // namespace omni::internal
