#include "fault_fs.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace omni::testing {
namespace {

using internal::ErrnoStatus;
using internal::Fd;

std::optional<std::pair<uint64_t, uint64_t>> KeyOfFd(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return std::nullopt;
  return std::make_pair(static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino));
}

std::optional<std::pair<uint64_t, uint64_t>> KeyOfPath(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return std::nullopt;
  return std::make_pair(static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino));
}

std::string DirPath(int dir) {
  if (dir == AT_FDCWD) return std::filesystem::current_path().string();
  std::error_code ec;
  return std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(dir), ec).string();
}

std::string Under(const std::string& dir, const std::string& name) {
  return name.empty() || name[0] == '/' ? name : dir + "/" + name;
}

std::string ReadWhole(int fd) {
  std::string out;
  char buf[1 << 16];
  off_t off = 0;
  while (true) {
    const ssize_t n = ::pread(fd, buf, sizeof(buf), off);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    off += n;
  }
  return out;
}

}  // namespace

FaultFileSystem::FaultFileSystem(std::string stash)
    : real_(internal::RealFileSystem()), stash_dir_(std::move(stash)) {}

void FaultFileSystem::Arm(Mode mode, int64_t at, int err) {
  absl::MutexLock l(&mu_);
  mode_ = mode;
  at_ = at;
  err_ = err;
  ops_ = 0;
  fired_ = false;
}

void FaultFileSystem::RefuseMutations(bool refuse) {
  absl::MutexLock l(&mu_);
  refuse_mutations_ = refuse;
}

int64_t FaultFileSystem::refused() const {
  absl::MutexLock l(&mu_);
  return refused_;
}

absl::Status FaultFileSystem::BeforeMutation(const char* what, const std::string& path) {
  {
    absl::MutexLock l(&mu_);
    if (refuse_mutations_) {
      ++refused_;
      return ErrnoStatus(EROFS, absl::StrCat("refused: ", what, " ", path));
    }
  }
  return Before(what, path);
}

int64_t FaultFileSystem::ops() const {
  absl::MutexLock l(&mu_);
  return ops_;
}

bool FaultFileSystem::fired() const {
  absl::MutexLock l(&mu_);
  return fired_;
}

absl::Status FaultFileSystem::Before(const char* what, const std::string& path) {
  absl::MutexLock l(&mu_);
  const int64_t n = ops_++;
  if (mode_ == Mode::kFail && n == at_) {
    fired_ = true;
    return ErrnoStatus(err_, absl::StrCat("injected: ", what, " ", path));
  }
  if (mode_ == Mode::kCrash && n >= at_) {
    fired_ = true;
    return ErrnoStatus(EIO, absl::StrCat("crashed: ", what, " ", path));
  }
  return absl::OkStatus();
}

std::string FaultFileSystem::StashName() {
  absl::MutexLock l(&mu_);
  return absl::StrCat(stash_dir_, "/", stashed_++);
}

void FaultFileSystem::Record(DirOp op) { pending_.push_back(std::move(op)); }

absl::StatusOr<Fd> FaultFileSystem::OpenDir(int dir, const std::string& name,
                                            const std::string& path) {
  if (absl::Status st = Before("open directory", path); !st.ok()) return st;
  return real_.OpenDir(dir, name, path);
}

absl::StatusOr<Fd> FaultFileSystem::OpenWrite(int dir, const std::string& name, bool truncate,
                                              bool exclusive, const std::string& path) {
  if (absl::Status st = BeforeMutation("create", path); !st.ok()) return st;
  struct stat before;
  const bool existed = ::fstatat(dir, name.c_str(), &before, AT_SYMLINK_NOFOLLOW) == 0;
  absl::StatusOr<Fd> fd = real_.OpenWrite(dir, name, truncate, exclusive, path);
  if (!fd.ok()) return fd;
  const auto key = KeyOfFd(fd->get());
  absl::MutexLock l(&mu_);
  if (key && (truncate || !existed)) dirty_.insert(*key);
  if (!existed) {
    DirOp op{Op::kCreateFile, DirPath(dir), name, "", "", {}, {}, "", false, {}};
    if (auto k = KeyOfFd(dir)) {
      op.dir_key = *k;
      op.unsynced.insert(*k);
    }
    Record(std::move(op));
  }
  return fd;
}

absl::StatusOr<Fd> FaultFileSystem::OpenRead(int dir, const std::string& name,
                                             const std::string& path) {
  if (absl::Status st = Before("open", path); !st.ok()) return st;
  return real_.OpenRead(dir, name, path);
}

absl::StatusOr<internal::FileStat> FaultFileSystem::Stat(int dir, const std::string& name,
                                                         const std::string& path) {
  if (absl::Status st = Before("stat", path); !st.ok()) return st;
  return real_.Stat(dir, name, path);
}

absl::Status FaultFileSystem::Write(int fd, const void* data, size_t n, uint64_t offset,
                                    const std::string& path) {
  if (absl::Status st = BeforeMutation("write", path); !st.ok()) return st;
  {
    absl::MutexLock l(&mu_);
    if (auto k = KeyOfFd(fd)) dirty_.insert(*k);
  }
  return real_.Write(fd, data, n, offset, path);
}

absl::Status FaultFileSystem::Sync(int fd, const std::string& path) {
  if (absl::Status st = BeforeMutation("fsync", path); !st.ok()) return st;
  if (absl::Status st = real_.Sync(fd, path); !st.ok()) return st;
  struct stat st;
  if (::fstat(fd, &st) != 0) return absl::OkStatus();
  const Key key{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
  absl::MutexLock l(&mu_);
  if (S_ISDIR(st.st_mode)) {
    for (DirOp& op : pending_) op.unsynced.erase(key);
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [](const DirOp& op) { return op.unsynced.empty(); }),
                   pending_.end());
  } else {
    synced_[key] = ReadWhole(fd);
    dirty_.erase(key);
  }
  return absl::OkStatus();
}

absl::Status FaultFileSystem::Rename(int from_dir, const std::string& from, int to_dir,
                                     const std::string& to, bool exchange,
                                     const std::string& path) {
  if (absl::Status st = BeforeMutation(exchange ? "exchange" : "rename", path); !st.ok()) return st;
  DirOp op{exchange ? Op::kExchange : Op::kRename,
           DirPath(from_dir),
           from,
           DirPath(to_dir),
           to,
           KeyOfFd(from_dir).value_or(Key{}),
           KeyOfFd(to_dir).value_or(Key{}),
           "",
           false,
           {}};
  if (!exchange) {
    struct stat target;
    if (::fstatat(to_dir, to.c_str(), &target, AT_SYMLINK_NOFOLLOW) == 0) {
      if (S_ISDIR(target.st_mode)) {
        op.replaced_empty_dir = true;  // rename(2) replaces only an empty directory
      } else {
        op.stash = StashName();
        if (::linkat(to_dir, to.c_str(), AT_FDCWD, op.stash.c_str(), 0) != 0) op.stash.clear();
      }
    }
  }
  if (absl::Status st = real_.Rename(from_dir, from, to_dir, to, exchange, path); !st.ok()) {
    if (!op.stash.empty()) ::unlink(op.stash.c_str());
    return st;
  }
  if (auto k = KeyOfFd(from_dir)) op.unsynced.insert(*k);
  if (auto k = KeyOfFd(to_dir)) op.unsynced.insert(*k);
  absl::MutexLock l(&mu_);
  Record(std::move(op));
  return absl::OkStatus();
}

absl::Status FaultFileSystem::Remove(int dir, const std::string& name, bool directory,
                                     const std::string& path) {
  if (absl::Status st = BeforeMutation("remove", path); !st.ok()) return st;
  DirOp op{directory ? Op::kRemoveDir : Op::kRemoveFile,
           DirPath(dir),
           name,
           "",
           "",
           KeyOfFd(dir).value_or(Key{}),
           {},
           "",
           false,
           {}};
  if (!directory) {
    op.stash = StashName();
    if (::linkat(dir, name.c_str(), AT_FDCWD, op.stash.c_str(), 0) != 0) op.stash.clear();
  }
  if (absl::Status st = real_.Remove(dir, name, directory, path); !st.ok()) {
    if (!op.stash.empty()) ::unlink(op.stash.c_str());
    return st;
  }
  if (auto k = KeyOfFd(dir)) op.unsynced.insert(*k);
  absl::MutexLock l(&mu_);
  Record(std::move(op));
  return absl::OkStatus();
}

absl::Status FaultFileSystem::Mkdir(int dir, const std::string& name, const std::string& path) {
  if (absl::Status st = BeforeMutation("mkdir", path); !st.ok()) return st;
  if (absl::Status st = real_.Mkdir(dir, name, path); !st.ok()) return st;
  DirOp op{Op::kMkdir, DirPath(dir), name, "", "", KeyOfFd(dir).value_or(Key{}), {}, "", false, {}};
  if (auto k = KeyOfFd(dir)) op.unsynced.insert(*k);
  absl::MutexLock l(&mu_);
  Record(std::move(op));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<internal::DirEntry>> FaultFileSystem::List(int dir,
                                                                      const std::string& path) {
  if (absl::Status st = Before("list", path); !st.ok()) return st;
  return real_.List(dir, path);
}

absl::Status FaultFileSystem::SetDirectIo(int fd, bool on, const std::string& path) {
  if (absl::Status st = BeforeMutation(on ? "direct I/O on" : "direct I/O off", path); !st.ok())
    return st;
  return real_.SetDirectIo(fd, on, path);
}

std::string FaultFileSystem::WhereNow(const std::string& root, Key key,
                                      const std::string& recorded) {
  if (KeyOfPath(root) == std::optional<Key>(key)) return root;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(root, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_symlink(ec) || !it->is_directory(ec)) continue;
    if (KeyOfPath(it->path().string()) == std::optional<Key>(key)) return it->path().string();
  }
  return recorded;
}

void FaultFileSystem::SimulateCrash(const std::string& root) {
  absl::MutexLock l(&mu_);
  // Directory entries first, newest first: each undo sees the tree as it was
  // right after its operation (directories found by inode: a directory may
  // have been renamed durably since).
  for (auto it = pending_.rbegin(); it != pending_.rend(); ++it) {
    DirOp op = *it;
    op.dir = WhereNow(root, op.dir_key, op.dir);
    if (!op.to_dir.empty()) op.to_dir = WhereNow(root, op.to_key, op.to_dir);
    const std::string p = Under(op.dir, op.name);
    std::error_code ec;
    switch (op.op) {
      case Op::kCreateFile:
        ::unlink(p.c_str());
        break;
      case Op::kMkdir:
        std::filesystem::remove_all(p, ec);
        break;
      case Op::kRename: {
        const std::string q = Under(op.to_dir, op.to_name);
        ::rename(q.c_str(), p.c_str());
        if (!op.stash.empty()) ::rename(op.stash.c_str(), q.c_str());
        if (op.replaced_empty_dir) ::mkdir(q.c_str(), 0755);
        break;
      }
      case Op::kExchange: {
        const std::string q = Under(op.to_dir, op.to_name);
        ::renameat2(AT_FDCWD, p.c_str(), AT_FDCWD, q.c_str(), RENAME_EXCHANGE);
        break;
      }
      case Op::kRemoveFile:
        if (!op.stash.empty()) ::rename(op.stash.c_str(), p.c_str());
        break;
      case Op::kRemoveDir:
        ::mkdir(p.c_str(), 0755);
        break;
    }
  }
  pending_.clear();
  // Then contents: every file written since its last fsync.
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(root, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file(ec) || it->is_symlink(ec)) continue;
    const std::string p = it->path().string();
    const auto key = KeyOfPath(p);
    if (!key || dirty_.count(*key) == 0) continue;
    auto synced = synced_.find(*key);
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    if (synced != synced_.end()) out << synced->second;
  }
  dirty_.clear();
  synced_.clear();
}

}  // namespace omni::testing
