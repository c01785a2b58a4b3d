// Small POSIX file helpers shared by the core (private).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace omni::internal {

// Status for a failed OS call: `what` (e.g. "open /x/y") plus strerror(err).
// ENOENT → NotFound, EACCES/EPERM/EROFS → PermissionDenied, ENOSPC/EDQUOT/EFBIG
// → ResourceExhausted, otherwise Internal.
absl::Status ErrnoStatus(int err, std::string_view what);

// Replaces `path` with `contents` atomically: writes `path`.tmp.<pid>, fsyncs
// it, renames it over `path`, fsyncs the directory. On failure the old file is
// intact and the temporary is removed.
absl::Status WriteFileAtomic(const std::string& path, std::string_view contents);

// OK when a file could be created in the directory of `path` (checked by
// creating and removing a probe file).
absl::Status CheckWritableDir(const std::string& path);

// The directory part of `path` ("." when none).
std::string DirName(const std::string& path);

}  // namespace omni::internal
