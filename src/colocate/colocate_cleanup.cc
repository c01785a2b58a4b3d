#include "omni/colocate_cleanup.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/fs.h"

namespace omni::colocate {

namespace {

using internal::ErrnoStatus;
using internal::Fd;

constexpr const char* kTmpPrefix = ".tmp-step-";
constexpr int kMaxDepth = 64;

// The names in the directory open as `dir_fd` (the descriptor stays open).
absl::StatusOr<std::vector<std::string>> Names(int dir_fd, const std::string& path) {
  Fd dup_fd(::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0));
  if (!dup_fd.valid()) return ErrnoStatus(errno, absl::StrCat("dup ", path));
  DIR* d = ::fdopendir(dup_fd.get());
  if (d == nullptr) return ErrnoStatus(errno, absl::StrCat("opendir ", path));
  dup_fd.Release();  // owned by d now
  std::vector<std::string> names;
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  const int err = errno;
  ::closedir(d);
  if (err != 0) return ErrnoStatus(err, absl::StrCat("readdir ", path));
  return names;
}

void Keep(absl::Status& first, absl::Status s) {
  if (first.ok() && !s.ok()) first = std::move(s);
}

// Removes `name` in the directory `parent_fd` and, when it is a directory
// (not a link to one), everything under it. Never follows a link.
void RemoveEntry(int parent_fd, const std::string& name, const std::string& path, int depth,
                 CleanupReport& report, absl::Status& first) {
  struct stat st {};
  if (::fstatat(parent_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno != ENOENT) Keep(first, ErrnoStatus(errno, absl::StrCat("stat ", path)));
    return;
  }
  if (S_ISDIR(st.st_mode)) {
    if (depth >= kMaxDepth) {
      Keep(first, absl::FailedPreconditionError(absl::StrCat(
                      "cleanup: ", path, " nests deeper than ", kMaxDepth, " directories; left")));
      return;
    }
    Fd fd(::openat(parent_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!fd.valid()) {
      if (errno == ELOOP || errno == ENOTDIR) {
        // Replaced by a link or a file since the stat: remove that, as such.
        RemoveEntry(parent_fd, name, path, depth, report, first);
        return;
      }
      Keep(first, ErrnoStatus(errno, absl::StrCat("open ", path)));
      return;
    }
    absl::StatusOr<std::vector<std::string>> names = Names(fd.get(), path);
    if (!names.ok()) {
      Keep(first, names.status());
      return;
    }
    for (const std::string& n : *names) {
      RemoveEntry(fd.get(), n, absl::StrCat(path, "/", n), depth + 1, report, first);
    }
    if (::unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR) != 0) {
      Keep(first, ErrnoStatus(errno, absl::StrCat("rmdir ", path)));
    }
    return;
  }
  if (::unlinkat(parent_fd, name.c_str(), 0) != 0) {
    if (errno != ENOENT) Keep(first, ErrnoStatus(errno, absl::StrCat("unlink ", path)));
    return;
  }
  ++report.files_removed;
  if (S_ISREG(st.st_mode)) report.bytes_removed += st.st_size;
}

}  // namespace

absl::StatusOr<CleanupReport> RemoveTempCheckpoints(const std::string& checkpoint_dir) {
  Fd dir(::open(checkpoint_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir.valid()) {
    const int err = errno;
    struct stat lst {};
    if ((err == ELOOP || err == ENOTDIR) && ::lstat(checkpoint_dir.c_str(), &lst) == 0 &&
        S_ISLNK(lst.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cleanup: checkpoint directory ", checkpoint_dir, " is a symlink; refused"));
    }
    if (err == ENOTDIR || err == ELOOP) {
      return absl::InvalidArgumentError(
          absl::StrCat("cleanup: ", checkpoint_dir, " is not a directory"));
    }
    return ErrnoStatus(err, absl::StrCat("open checkpoint directory ", checkpoint_dir));
  }
  absl::StatusOr<std::vector<std::string>> names = Names(dir.get(), checkpoint_dir);
  if (!names.ok()) return names.status();
  CleanupReport report;
  absl::Status first;
  const uid_t me = ::geteuid();
  for (const std::string& n : *names) {
    if (!absl::StartsWith(n, kTmpPrefix)) continue;
    const std::string path = absl::StrCat(checkpoint_dir, "/", n);
    struct stat st {};
    if (::fstatat(dir.get(), n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT) Keep(first, ErrnoStatus(errno, absl::StrCat("stat ", path)));
      continue;
    }
    if (st.st_uid != me) {
      report.skipped.push_back(absl::StrCat(n, ": owned by uid ", st.st_uid));
      continue;
    }
    absl::Status entry_status;
    RemoveEntry(dir.get(), n, path, 0, report, entry_status);
    if (entry_status.ok()) {
      ++report.entries_removed;
    } else {
      report.skipped.push_back(absl::StrCat(n, ": ", entry_status.message()));
      Keep(first, entry_status);
    }
  }
  if (!first.ok()) return first;
  return report;
}

}  // namespace omni::colocate
