#include "common/fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>

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
  // Unique per call: threads of one process may probe the same directory at
  // once (replicas as threads opening one FileStore).
  static std::atomic<uint64_t> probes{0};
  const std::string probe = absl::StrCat(path, ".probe.", ::getpid(), ".",
                                         probes.fetch_add(1, std::memory_order_relaxed));
  Fd fd(::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) return ErrnoStatus(errno, absl::StrCat("cannot write ", path));
  ::unlink(probe.c_str());
  return absl::OkStatus();
}

// ---------------------------------------------------------------- the seam

absl::Status FileSystem::SetDirectIo(int /*fd*/, bool /*on*/, const std::string& path) {
  return absl::UnimplementedError(absl::StrCat(path, ": no direct I/O on this file system"));
}

namespace {

FileType TypeOf(mode_t m) {
  if (S_ISREG(m)) return FileType::kRegular;
  if (S_ISDIR(m)) return FileType::kDirectory;
  if (S_ISLNK(m)) return FileType::kSymlink;
  return FileType::kOther;
}

absl::Status SymlinkError(const std::string& path) {
  return absl::FailedPreconditionError(absl::StrCat(
      path,
      " is a symbolic link; not followed (nothing in a checkpoint directory may lead out "
      "of it): remove it"));
}

absl::Status NotRegularError(const std::string& path, mode_t m) {
  const char* what = S_ISFIFO(m)   ? "a FIFO"
                     : S_ISDIR(m)  ? "a directory"
                     : S_ISCHR(m)  ? "a character device"
                     : S_ISBLK(m)  ? "a block device"
                     : S_ISSOCK(m) ? "a socket"
                                   : "not a regular file";
  return absl::FailedPreconditionError(
      absl::StrCat(path, " is ", what, ", not a regular file; not read"));
}

// After an open with O_NOFOLLOW failed with ELOOP (or ENOTDIR / ENXIO, which
// other file types give): a clearer error when the entry is a symbolic link
// or of another type.
absl::Status OpenError(int err, int dir, const std::string& name, const std::string& path,
                       std::string_view what) {
  struct stat st;
  if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISLNK(st.st_mode)) return SymlinkError(path);
    if (err == ENXIO || err == ENOTDIR || err == EISDIR) {
      if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) return NotRegularError(path, st.st_mode);
    }
  }
  return ErrnoStatus(err, absl::StrCat(Sv(what), " ", path));
}

// The fd opened without blocking (a FIFO would block an open for reading
// until a writer came): refuses anything but a regular file, then clears
// O_NONBLOCK.
absl::StatusOr<Fd> CheckRegular(Fd fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", path));
  if (!S_ISREG(st.st_mode)) return NotRegularError(path, st.st_mode);
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return ErrnoStatus(errno, absl::StrCat("fcntl ", path));
  }
  return fd;
}

// Switches O_DIRECT off; false when it was not on (or cannot be changed).
bool ClearDirectIo(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && (flags & O_DIRECT) != 0 && ::fcntl(fd, F_SETFL, flags & ~O_DIRECT) == 0;
}

class RealFs final : public FileSystem {
 public:
  absl::StatusOr<Fd> OpenDir(int dir, const std::string& name, const std::string& path) override {
    const int nofollow = dir == AT_FDCWD ? 0 : O_NOFOLLOW;
    Fd fd(::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | nofollow));
    if (!fd.valid()) return OpenError(errno, dir, name, path, "open directory");
    return fd;
  }
  absl::StatusOr<Fd> OpenWrite(int dir, const std::string& name, bool truncate, bool exclusive,
                               const std::string& path) override {
    const int flags =
        O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (exclusive ? O_EXCL : 0);
    Fd fd(::openat(dir, name.c_str(), flags, 0644));
    if (!fd.valid()) {
      if (errno == EEXIST) return absl::AlreadyExistsError(absl::StrCat(path, " exists"));
      return OpenError(errno, dir, name, path, "create");
    }
    absl::StatusOr<Fd> checked = CheckRegular(std::move(fd), path);
    if (!checked.ok()) return checked.status();
    // Truncated only once known to be a regular file (O_TRUNC on open would
    // act before the check).
    if (truncate && ::ftruncate(checked->get(), 0) != 0) {
      return ErrnoStatus(errno, absl::StrCat("truncate ", path));
    }
    return checked;
  }
  absl::StatusOr<Fd> OpenRead(int dir, const std::string& name, const std::string& path) override {
    const int nofollow = dir == AT_FDCWD ? 0 : O_NOFOLLOW;
    Fd fd(::openat(dir, name.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | nofollow));
    if (!fd.valid()) return OpenError(errno, dir, name, path, "open");
    return CheckRegular(std::move(fd), path);
  }
  absl::StatusOr<FileStat> Stat(int dir, const std::string& name,
                                const std::string& path) override {
    struct stat st;
    const int flags = name.empty() ? AT_EMPTY_PATH : AT_SYMLINK_NOFOLLOW;
    if (::fstatat(dir, name.c_str(), &st, flags) != 0) {
      return ErrnoStatus(errno, absl::StrCat("stat ", path));
    }
    FileStat out;
    out.type = TypeOf(st.st_mode);
    out.size = static_cast<uint64_t>(st.st_size);
    out.mtime = st.st_mtim;
    out.links = static_cast<uint64_t>(st.st_nlink);
    return out;
  }
  absl::Status Write(int fd, const void* data, size_t n, uint64_t offset,
                     const std::string& path) override {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::pwrite(fd, p, std::min(n, size_t{1} << 30), static_cast<off_t>(offset));
      if (w < 0) {
        if (errno == EINTR) continue;
        // Direct I/O refused for its alignment (a device with larger
        // blocks, or the rest of a short write): the same bytes through the
        // page cache instead.
        if (errno == EINVAL && ClearDirectIo(fd)) continue;
        return ErrnoStatus(errno, absl::StrCat("write ", path));
      }
      if (w == 0) return ErrnoStatus(EIO, absl::StrCat("write ", path));
      p += w;
      n -= static_cast<size_t>(w);
      offset += static_cast<uint64_t>(w);
    }
    return absl::OkStatus();
  }
  absl::Status SetDirectIo(int fd, bool on, const std::string& path) override {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0) return ErrnoStatus(errno, absl::StrCat("fcntl ", path));
    if (((flags & O_DIRECT) != 0) == on) return absl::OkStatus();
    if (::fcntl(fd, F_SETFL, on ? (flags | O_DIRECT) : (flags & ~O_DIRECT)) != 0) {
      return ErrnoStatus(errno, absl::StrCat(on ? "direct I/O on " : "direct I/O off ", path));
    }
    return absl::OkStatus();
  }
  absl::Status Sync(int fd, const std::string& path) override {
    if (::fsync(fd) == 0) return absl::OkStatus();
    const int err = errno;
    struct stat st;
    if ((err == EINVAL || err == ENOTSUP) && ::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
      return absl::OkStatus();  // some file systems cannot fsync a directory
    }
    return ErrnoStatus(err, absl::StrCat("fsync ", path));
  }
  absl::Status Rename(int from_dir, const std::string& from, int to_dir, const std::string& to,
                      bool exchange, const std::string& path) override {
    if (::renameat2(from_dir, from.c_str(), to_dir, to.c_str(), exchange ? RENAME_EXCHANGE : 0) ==
        0) {
      return absl::OkStatus();
    }
    if (!exchange && (errno == EEXIST || errno == ENOTEMPTY)) {
      return absl::AlreadyExistsError(
          absl::StrCat("rename ", path, ": the target exists and is not empty"));
    }
    if (exchange && (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP)) {
      return absl::UnimplementedError(
          absl::StrCat("exchange ", path, ": not supported by this file system"));
    }
    return ErrnoStatus(errno, absl::StrCat(exchange ? "exchange " : "rename ", path));
  }
  absl::Status Remove(int dir, const std::string& name, bool directory,
                      const std::string& path) override {
    if (::unlinkat(dir, name.c_str(), directory ? AT_REMOVEDIR : 0) != 0) {
      return ErrnoStatus(errno, absl::StrCat("remove ", path));
    }
    return absl::OkStatus();
  }
  absl::Status Mkdir(int dir, const std::string& name, const std::string& path) override {
    if (::mkdirat(dir, name.c_str(), 0755) != 0) {
      if (errno == EEXIST) return absl::AlreadyExistsError(absl::StrCat(path, " exists"));
      return ErrnoStatus(errno, absl::StrCat("create directory ", path));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<DirEntry>> List(int dir, const std::string& path) override {
    const int dup = ::fcntl(dir, F_DUPFD_CLOEXEC, 0);
    if (dup < 0) return ErrnoStatus(errno, absl::StrCat("list ", path));
    struct Closer {
      void operator()(DIR* d) const { ::closedir(d); }
    };
    std::unique_ptr<DIR, Closer> d(::fdopendir(dup));
    if (!d) {
      const int err = errno;
      ::close(dup);
      return ErrnoStatus(err, absl::StrCat("list ", path));
    }
    ::rewinddir(d.get());
    std::vector<DirEntry> out;
    errno = 0;
    while (const dirent* e = ::readdir(d.get())) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      DirEntry de;
      de.name = name;
      switch (e->d_type) {
        case DT_REG:
          de.type = FileType::kRegular;
          break;
        case DT_DIR:
          de.type = FileType::kDirectory;
          break;
        case DT_LNK:
          de.type = FileType::kSymlink;
          break;
        case DT_UNKNOWN: {
          struct stat st;
          if (::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
            de.type = TypeOf(st.st_mode);
          }
          break;
        }
        default:
          de.type = FileType::kOther;
      }
      out.push_back(std::move(de));
      errno = 0;
    }
    if (errno != 0) return ErrnoStatus(errno, absl::StrCat("list ", path));
    std::sort(out.begin(), out.end(),
              [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
    return out;
  }
};

}  // namespace

FileSystem& RealFileSystem() {
  static RealFs* fs = new RealFs();  // never destroyed: usable from any static's destructor
  return *fs;
}

absl::StatusOr<std::string> ReadFileAt(FileSystem& fs, int dir, const std::string& name,
                                       const std::string& path, size_t max_bytes) {
  absl::StatusOr<Fd> fd = fs.OpenRead(dir, name, path);
  if (!fd.ok()) return fd.status();
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", path));
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(path, ": ", st.st_size,
                                                     " bytes, more than the limit of ", max_bytes,
                                                     " for this file; not read"));
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n =
        ::pread(fd->get(), out.data() + got, out.size() - got, static_cast<off_t>(got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("read ", path));
    }
    if (n == 0) break;  // shrank meanwhile
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

absl::Status WriteFileSyncedAt(FileSystem& fs, int dir, const std::string& name,
                               std::string_view contents, const std::string& path) {
  absl::StatusOr<Fd> fd = fs.OpenWrite(dir, name, /*truncate=*/true, /*exclusive=*/false, path);
  if (!fd.ok()) return fd.status();
  if (absl::Status st = fs.Write(fd->get(), contents.data(), contents.size(), 0, path); !st.ok()) {
    return st;
  }
  if (absl::Status st = fs.Sync(fd->get(), path); !st.ok()) return st;
  return fd->Close(path);
}

absl::Status RemoveTreeAt(FileSystem& fs, int dir, const std::string& name,
                          const std::string& path) {
  absl::StatusOr<FileStat> st = fs.Stat(dir, name, path);
  if (!st.ok()) return absl::IsNotFound(st.status()) ? absl::OkStatus() : st.status();
  if (st->type != FileType::kDirectory) return fs.Remove(dir, name, false, path);
  absl::Status first;
  {
    absl::StatusOr<Fd> sub = fs.OpenDir(dir, name, path);
    if (!sub.ok()) return sub.status();
    absl::StatusOr<std::vector<DirEntry>> entries = fs.List(sub->get(), path);
    if (!entries.ok()) return entries.status();
    for (const DirEntry& e : *entries) {
      absl::Status r = RemoveTreeAt(fs, sub->get(), e.name, absl::StrCat(path, "/", e.name));
      if (first.ok()) first = r;
    }
  }
  absl::Status r = fs.Remove(dir, name, true, path);
  return first.ok() ? r : first;
}

}  // namespace omni::internal
