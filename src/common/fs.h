// Small POSIX file helpers shared by the core (private).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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

// ---------------------------------------------------------------- the seam
//
// FileSystem: the one place the checkpoint writer does file I/O (as leveldb's
// Env), so that tests can fail any operation or simulate a crash. Every name
// is opened relative to a directory fd and never followed when it is a
// symbolic link: nothing inside a directory the caller opened can lead out of
// it. With dir == AT_FDCWD, `name` is a path the caller (the user) named and
// may pass through symbolic links. `path` arguments only name the file in
// error messages.
//
// Errors: ErrnoStatus codes; a symbolic link where a file or directory is
// expected is FailedPrecondition ("... is a symbolic link; not followed"),
// any other file type where a regular file is expected (a FIFO, a device) is
// FailedPrecondition too, found without blocking.
//
// Thread safety: the real file system is stateless; implementations must
// allow calls from several threads.

enum class FileType { kRegular, kDirectory, kSymlink, kOther };

struct DirEntry {
  std::string name;
  FileType type = FileType::kOther;
};

struct FileStat {
  FileType type = FileType::kOther;
  uint64_t size = 0;
  struct timespec mtime = {};
  uint64_t links = 0;  // hard links: 0 once an open entry was removed
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // Opens the directory `name` under `dir` (AT_FDCWD: a path, which may pass
  // through symbolic links: the caller named it) for *at calls and fsync.
  virtual absl::StatusOr<Fd> OpenDir(int dir, const std::string& name, const std::string& path) = 0;
  // Opens the regular file `name` for writing (O_RDWR), creating it
  // (0644) when missing; `truncate` empties it, `exclusive` fails with
  // AlreadyExists when it exists.
  virtual absl::StatusOr<Fd> OpenWrite(int dir, const std::string& name, bool truncate,
                                       bool exclusive, const std::string& path) = 0;
  // Opens the existing regular file `name` read-only.
  virtual absl::StatusOr<Fd> OpenRead(int dir, const std::string& name,
                                      const std::string& path) = 0;
  // The entry `name` itself (a symbolic link is reported as one); with an
  // empty `name`, the open file or directory `dir` (which may have been
  // removed meanwhile: links 0).
  virtual absl::StatusOr<FileStat> Stat(int dir, const std::string& name,
                                        const std::string& path) = 0;
  // Full positional write (retries short writes and EINTR).
  virtual absl::Status Write(int fd, const void* data, size_t n, uint64_t offset,
                             const std::string& path) = 0;
  // fsync of a file or a directory (a directory whose file system refuses
  // fsync with EINVAL counts as synced).
  virtual absl::Status Sync(int fd, const std::string& path) = 0;
  // renameat2 of the entry itself (never its target); `exchange` swaps two
  // existing entries atomically (Unimplemented where the file system cannot).
  // AlreadyExists when (without `exchange`) the target is a non-empty
  // directory.
  virtual absl::Status Rename(int from_dir, const std::string& from, int to_dir,
                              const std::string& to, bool exchange, const std::string& path) = 0;
  // Removes the entry `name` (an empty directory when `directory`). A
  // symbolic link is removed itself.
  virtual absl::Status Remove(int dir, const std::string& name, bool directory,
                              const std::string& path) = 0;
  virtual absl::Status Mkdir(int dir, const std::string& name, const std::string& path) = 0;
  // The entries of an open directory (without . and ..), sorted by name.
  virtual absl::StatusOr<std::vector<DirEntry>> List(int dir, const std::string& path) = 0;

  // Optional: switches direct I/O (O_DIRECT: writes bypass the page cache)
  // on or off for the open file `fd`. While it is on, every Write must pass
  // a buffer, offset and length that are multiples of kDirectIoAlign (a
  // Write the file system still refuses for its alignment is retried
  // without direct I/O). Unimplemented where this file system cannot (the
  // default); the kernel's refusal (EINVAL: a file system without direct
  // I/O, e.g. an old tmpfs) as an ErrnoStatus. Callers treat any error of
  // switching it on as "use buffered I/O".
  virtual absl::Status SetDirectIo(int fd, bool on, const std::string& path);
};

// Alignment of buffers, offsets and lengths for direct I/O (the largest
// logical block size of common devices).
inline constexpr size_t kDirectIoAlign = 4096;

// The operating system's file system.
FileSystem& RealFileSystem();

// Reads the regular file `name` under `dir` whole; ResourceExhausted naming
// `path` when it holds more than `max_bytes` (checked before reading).
absl::StatusOr<std::string> ReadFileAt(FileSystem& fs, int dir, const std::string& name,
                                       const std::string& path, size_t max_bytes);
// Writes a new file `name` under `dir` and fsyncs it (no rename: for
// directories no reader looks into until they are renamed into place).
absl::Status WriteFileSyncedAt(FileSystem& fs, int dir, const std::string& name,
                               std::string_view contents, const std::string& path);
// Removes `name` under `dir` and, when it is a directory, everything in it,
// without following any symbolic link (a link is removed itself). Best
// effort: the first error is returned, the rest is still tried.
absl::Status RemoveTreeAt(FileSystem& fs, int dir, const std::string& name,
                          const std::string& path);

}  // namespace omni::internal
