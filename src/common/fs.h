// Small POSIX file helpers shared by the core (private).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace omni::internal {

// An owned file descriptor (closed on destruction; movable).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& o) noexcept : fd_(o.Release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = o.Release();
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    const int f = fd_;
    fd_ = -1;
    return f;
  }
  void Reset();
  // Closes, reporting a failed close (NFS reports write errors there).
  absl::Status Close(const std::string& path);

 private:
  int fd_ = -1;
};

// Status for a failed OS call: `what` (e.g. "open /x/y") plus strerror(err).
// ENOENT → NotFound, EACCES/EPERM/EROFS → PermissionDenied, ENOSPC/EDQUOT/EFBIG
// → ResourceExhausted, otherwise Internal.
absl::Status ErrnoStatus(int err, std::string_view what);

// Replaces `path` with `contents` atomically: writes `path`.tmp.<pid>, fsyncs
// it (when `durable`), renames it over `path`, fsyncs the directory (when
// `durable`). On failure the old file is intact and the temporary is removed.
// Without `durable` readers still see the old or the new contents, never a
// mix, but a crash of the whole host may lose the change.
absl::Status WriteFileAtomic(const std::string& path, std::string_view contents,
                             bool durable = true);

// OK when a file could be created in the directory of `path` (checked by
// creating and removing a probe file).
absl::Status CheckWritableDir(const std::string& path);

// The directory part of `path` ("." when none).
std::string DirName(const std::string& path);

}  // namespace omni::internal
