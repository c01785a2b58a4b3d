// Cleanup after a preempted or crashed job: its temporary checkpoint files on
// shared storage are removed, so a shared disk never fills with the halves of
// saves that never committed.
//
// Only entries named ".tmp-step-*" directly in the job's checkpoint
// directory, and only those owned by the calling user, are removed (with
// everything under them). Symbolic links are never followed: the directory
// itself is opened with O_NOFOLLOW (a symlinked checkpoint directory is
// refused), every descent uses openat(..., O_NOFOLLOW | O_DIRECTORY) on the
// parent's descriptor, and a link found anywhere is removed as a link
// (unlinkat), never its target. So another user who plants a link to their
// files (or to /) in a shared checkpoint directory cannot make the cleanup
// delete anything outside it.
//
// Call it only when the job is not running (after its exit, or after the
// scheduler declared it crashed): a save in progress writes under such an
// entry.
//
// Thread safety: may be called from any thread; not concurrently on the same
// directory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "omni/export.h"

namespace omni::colocate {

struct CleanupReport {
  int entries_removed = 0;    // top-level ".tmp-step-*" entries removed
  int64_t files_removed = 0;  // files and links removed, at any depth
  int64_t bytes_removed = 0;  // sizes of the regular files removed
  // Top-level entries left in place and why (e.g. "owned by uid 1001").
  std::vector<std::string> skipped;
};

// Removes the ".tmp-step-*" entries of `checkpoint_dir` owned by the
// effective user. NotFound when the directory does not exist,
// InvalidArgument when it is a symlink or not a directory, or the errno
// status naming the path of the first entry that could not be removed
// (the others are still tried).
OMNI_EXPORT absl::StatusOr<CleanupReport> RemoveTempCheckpoints(const std::string& checkpoint_dir);

}  // namespace omni::colocate
