// The job-level checkpoint manager on another FileSystem (private: for the
// tests that interpose on its file operations, tests/unit/job_checkpoint_test.cc).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/fs.h"
#include "omni/export.h"
#include "omni/job_checkpoint.h"

namespace omni::internal {

// As JobCheckpointManager::Open, with every file operation of the manager
// going through `fs`, which must outlive it (the job lock's flock calls go
// to the descriptors `fs` opened).
OMNI_EXPORT absl::StatusOr<std::unique_ptr<JobCheckpointManager>> OpenJobCheckpointManagerOn(
    const JobCheckpointOptions& options, FileSystem& fs);

}  // namespace omni::internal
