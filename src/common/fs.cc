#include "common/fs.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/strings.h"

namespace omni::internal {

absl::Status ErrnoStatus(int err, std::string_view what) {
  const std::string msg = absl::StrCat(Sv(what), ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

std::string DirName(const std::string& path) {
  const auto pos = path.rfind('/');
  if (pos == std::string::npos) return ".";
  if (pos == 0) return "/";
  return path.substr(0, pos);
}

void Fd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

absl::Status Fd::Close(const std::string& path) {
  const int f = Release();
  if (f >= 0 && ::close(f) != 0) return ErrnoStatus(errno, absl::StrCat("close ", path));
  return absl::OkStatus();
}

namespace {

absl::Status WriteAll(int fd, std::string_view data, const std::string& path) {
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("write ", path));
    }
    off += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFileAtomic(const std::string& path, std::string_view contents, bool durable) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  absl::Status st;
  {
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) return ErrnoStatus(errno, absl::StrCat("create ", tmp));
    st = WriteAll(fd.get(), contents, tmp);
    if (st.ok() && durable && ::fsync(fd.get()) != 0) {
      st = ErrnoStatus(errno, absl::StrCat("fsync ", tmp));
    }
    if (absl::Status closed = fd.Close(tmp); !closed.ok() && st.ok()) st = closed;
  }
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = ErrnoStatus(errno, absl::StrCat("rename ", tmp, " -> ", path));
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  if (!durable) return absl::OkStatus();
  const std::string dir = DirName(path);
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() >= 0) ::fsync(dfd.get());  // best effort: some file systems refuse
  return absl::OkStatus();
}

absl::Status CheckWritableDir(const std::string& path) {
  const std::string probe = absl::StrCat(path, ".probe.", ::getpid());
  Fd fd(::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) return ErrnoStatus(errno, absl::StrCat("cannot write ", path));
  ::unlink(probe.c_str());
  return absl::OkStatus();
}

}  // namespace omni::internal
