// FileStore: omni::Store in a directory (file_store.h), opened by OpenStore
// for file:///abs/dir. All its file I/O goes through the file-system seam
// (common/fs.h), so tests fail or crash any operation (tests/unit/fault_fs.h).
//
// Layout in its directory:
//
//   <dir>/.lock          flock'ed around every write (Set, Add, CompareAndSet,
//                        Delete), so read-modify-write is atomic across
//                        processes; the kernel drops it when a holder dies.
//   <dir>/k-<encoded>    one file per key, its contents the value. The key is
//                        encoded with '/' -> '%' and '.' -> '+' (neither is a
//                        key character, so the encoding is injective): a name
//                        never contains '/' or '.', so it is never ".", "..",
//                        a path, the lock file or a temporary.
//   <dir>/k-<encoded>.tmp.<pid>
//                        the next value of a key while it is written; only
//                        under the lock, so one found while holding the lock
//                        is a dead writer's and is removed at open.
//
// A write is: temporary (created, written, fsynced when durable), renamed
// over the key's file, the directory fsynced when durable. A reader needs no
// lock: it sees the old or the new file, never a mix. A write that fails
// leaves the previous value and removes its temporary. Without `durable` a
// crash of the whole host may lose the writes of the last seconds (each key
// keeps its previous value or its new one); with it, a write that returned
// OK survives the crash.
//
// The directory is opened again by its path for every call (not held), so a
// store whose directory is replaced under the job sees the new one, as every
// other process does; nothing inside it is followed when it is a symbolic
// link (the seam opens with O_NOFOLLOW and reads only regular files).
//
// Besides the flock, writers of one process serialise on a process-wide
// mutex: on NFS, Linux emulates flock with POSIX record locks, which are
// owned by the process and so do not exclude threads of one process (and
// the temporary name is per process).
#include "store/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/const_init.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/fs.h"
#include "omni/store.h"
#include "store/poll.h"

namespace omni::internal {
namespace {

// How long a writer waits for the directory lock. Holders only do a few
// small file operations, and a dead holder's lock is dropped by the kernel,
// so this only trips on a hung file system.
constexpr absl::Duration kLockTimeout = absl::Seconds(60);

// Longest value the store keeps (a store holds small records; this bounds
// what a reader allocates for a file planted in the directory).
constexpr size_t kMaxValueBytes = size_t{64} << 20;

// Writers of this process, around the flock (see the file comment).
ABSL_CONST_INIT absl::Mutex g_writer_mu(absl::kConstInit);

// Holds g_writer_mu and an exclusive flock on the lock file; both are
// released on destruction (closing the fd drops the flock).
class DirLock {
 public:
  // Takes the lock on `name` under the directory `dir` (created if
  // missing), retrying for at most kLockTimeout.
  static absl::StatusOr<std::unique_ptr<DirLock>> Acquire(FileSystem& fs, int dir,
                                                          const std::string& name,
                                                          const std::string& path) {
    auto lock = std::make_unique<DirLock>();
    absl::StatusOr<Fd> fd = fs.OpenWrite(dir, name, /*truncate=*/false, /*exclusive=*/false, path);
    if (!fd.ok()) return fd.status();
    lock->fd_ = *std::move(fd);
    absl::StatusOr<bool> locked = PollUntil(kLockTimeout, [&]() -> absl::StatusOr<bool> {
      for (;;) {
        if (::flock(lock->fd_.get(), LOCK_EX | LOCK_NB) == 0) return true;
        if (errno == EINTR) continue;
        if (errno == EWOULDBLOCK) return false;
        return ErrnoStatus(errno, absl::StrCat("flock ", path));
      }
    });
    if (!locked.ok()) return locked.status();
    if (!*locked) {
      return absl::DeadlineExceededError(absl::StrCat("lock file ", path, " still held after ",
                                                      absl::FormatDuration(kLockTimeout)));
    }
    return lock;
  }

  // Takes g_writer_mu; use Acquire.
  DirLock() : hold_(&g_writer_mu) {}

 private:
  absl::MutexLock hold_;  // declared first: released last
  Fd fd_;
};

// The directory and its lock, held for one write.
struct Locked {
  Fd dir;
  std::unique_ptr<DirLock> lock;
};

class FileStore final : public Store {
 public:
  FileStore(std::string dir, bool durable, FileSystem& fs)
      : fs_(fs),
        dir_(std::move(dir)),
        lock_path_(dir_ + "/.lock"),
        durable_(durable),
        label_(absl::StrCat("FileStore ", dir_)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    if (absl::Status st = Check(key, value); !st.ok()) return st;
    absl::StatusOr<Locked> locked = Lock();
    if (!locked.ok()) return Annotate(locked.status(), key);
    return Write(locked->dir.get(), key, value);
  }

  absl::StatusOr<std::optional<std::string>> TryGet(const std::string& key) override {
    if (absl::Status st = ValidateStoreKey(key); !st.ok()) return st;
    absl::StatusOr<Fd> dir = OpenDir();
    if (!dir.ok()) return Annotate(dir.status(), key);
    return Read(dir->get(), key);
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    if (absl::Status st = ValidateStoreKey(key); !st.ok()) return st;
    absl::StatusOr<Locked> locked = Lock();
    if (!locked.ok()) return Annotate(locked.status(), key);
    absl::StatusOr<std::optional<std::string>> current = Read(locked->dir.get(), key);
    if (!current.ok()) return current.status();
    int64_t value = 0;
    if (current->has_value() && !absl::SimpleAtoi(**current, &value)) {
      return absl::InvalidArgumentError(absl::StrCat(label_, ": key '", key, "' holds '",
                                                     absl::CHexEscape(current->value()),
                                                     "', not a counter"));
    }
    int64_t sum = 0;
    if (__builtin_add_overflow(value, delta, &sum)) {
      return absl::OutOfRangeError(
          absl::StrCat(label_, ": key '", key, "': ", value, " + ", delta, " overflows int64"));
    }
    if (absl::Status st = Write(locked->dir.get(), key, absl::StrCat(sum)); !st.ok()) return st;
    return sum;
  }

  absl::StatusOr<std::string> CompareAndSet(const std::string& key, const std::string& expected,
                                            const std::string& desired) override {
    if (absl::Status st = Check(key, desired); !st.ok()) return st;
    absl::StatusOr<Locked> locked = Lock();
    if (!locked.ok()) return Annotate(locked.status(), key);
    absl::StatusOr<std::optional<std::string>> current = Read(locked->dir.get(), key);
    if (!current.ok()) return current.status();
    const bool matches =
        current->has_value() ? !expected.empty() && **current == expected : expected.empty();
    if (!matches) {
      if (current->has_value()) return std::move(**current);
      return absl::NotFoundError(
          absl::StrCat(label_, ": compare-and-set of missing key '", key, "' expected a value"));
    }
    if (absl::Status st = Write(locked->dir.get(), key, desired); !st.ok()) return st;
    return desired;
  }

  absl::StatusOr<bool> Delete(const std::string& key) override {
    if (absl::Status st = ValidateStoreKey(key); !st.ok()) return st;
    absl::StatusOr<Locked> locked = Lock();
    if (!locked.ok()) return Annotate(locked.status(), key);
    const std::string name = NameOf(key);
    absl::Status st = fs_.Remove(locked->dir.get(), name, /*directory=*/false, PathOf(name));
    if (absl::IsNotFound(st)) return false;
    if (st.ok() && durable_) st = fs_.Sync(locked->dir.get(), dir_);
    if (!st.ok()) return Annotate(st, key);
    return true;
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    return PollGet(*this, key, timeout, label_);
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    return PollWait(*this, keys, timeout, label_);
  }

  // Under the lock: removes the temporaries of writers that died mid-write
  // (every live writer's are gone once it releases the lock) and checks that
  // a file can be created here, so that an unusable directory fails at open
  // rather than at the first Set.
  absl::Status Prepare() {
    absl::StatusOr<Locked> locked = Lock();
    if (!locked.ok()) return locked.status();
    absl::StatusOr<std::vector<DirEntry>> entries = fs_.List(locked->dir.get(), dir_);
    if (!entries.ok()) return entries.status();
    for (const DirEntry& e : *entries) {
      if (e.type != FileType::kRegular || !IsTemporary(e.name)) continue;
      if (absl::Status st = fs_.Remove(locked->dir.get(), e.name, false, PathOf(e.name));
          !st.ok() && !absl::IsNotFound(st)) {
        return st;
      }
    }
    const std::string probe = absl::StrCat(".probe.tmp.", ::getpid());
    absl::StatusOr<Fd> fd = fs_.OpenWrite(locked->dir.get(), probe, /*truncate=*/true,
                                          /*exclusive=*/false, PathOf(probe));
    if (!fd.ok()) {
      return absl::Status(fd.status().code(),
                          absl::StrCat("directory is not writable: ", fd.status().message()));
    }
    fd->Reset();
    return fs_.Remove(locked->dir.get(), probe, false, PathOf(probe));
  }

  const std::string& label() const { return label_; }

 private:
  static bool IsTemporary(const std::string& name) {
    return name.find(".tmp.") != std::string::npos;
  }

  static std::string NameOf(const std::string& key) {
    std::string name = "k-" + key;
    std::replace(name.begin(), name.end(), '/', '%');
    std::replace(name.begin(), name.end(), '.', '+');
    return name;
  }

  std::string PathOf(const std::string& name) const { return absl::StrCat(dir_, "/", name); }

  absl::Status Check(const std::string& key, const std::string& value) const {
    if (absl::Status st = ValidateStoreKey(key); !st.ok()) return st;
    if (value.size() > kMaxValueBytes) {
      return absl::InvalidArgumentError(absl::StrCat(label_, ": key '", key, "': value of ",
                                                     value.size(), " bytes is over the limit of ",
                                                     kMaxValueBytes));
    }
    return absl::OkStatus();
  }

  // `st` with the same code, its message prefixed with the store and key.
  absl::Status Annotate(const absl::Status& st, const std::string& key) const {
    return absl::Status(st.code(), absl::StrCat(label_, ": key '", key, "': ", st.message()));
  }

  absl::StatusOr<Fd> OpenDir() { return fs_.OpenDir(AT_FDCWD, dir_, dir_); }

  absl::StatusOr<Locked> Lock() {
    Locked locked;
    absl::StatusOr<Fd> dir = OpenDir();
    if (!dir.ok()) return dir.status();
    locked.dir = *std::move(dir);
    absl::StatusOr<std::unique_ptr<DirLock>> lock =
        DirLock::Acquire(fs_, locked.dir.get(), ".lock", lock_path_);
    if (!lock.ok()) return lock.status();
    locked.lock = *std::move(lock);
    return locked;
  }

  absl::StatusOr<std::optional<std::string>> Read(int dir, const std::string& key) {
    const std::string name = NameOf(key);
    absl::StatusOr<std::string> value = ReadFileAt(fs_, dir, name, PathOf(name), kMaxValueBytes);
    if (value.ok()) return std::optional<std::string>(*std::move(value));
    if (absl::IsNotFound(value.status())) return std::optional<std::string>();
    return Annotate(value.status(), key);
  }

  // REQUIRES: the lock is held. See the file comment for the steps and what
  // `durable_` adds; on failure the temporary is removed (best effort: a
  // leftover one is removed at the next open) and the previous value stays.
  absl::Status Write(int dir, const std::string& key, const std::string& value) {
    const std::string name = NameOf(key);
    const std::string tmp = absl::StrCat(name, ".tmp.", ::getpid());
    const std::string tmp_path = PathOf(tmp);
    absl::Status st;
    {
      absl::StatusOr<Fd> fd =
          fs_.OpenWrite(dir, tmp, /*truncate=*/true, /*exclusive=*/false, tmp_path);
      if (!fd.ok()) return Annotate(fd.status(), key);
      st = fs_.Write(fd->get(), value.data(), value.size(), 0, tmp_path);
      if (st.ok() && durable_) st = fs_.Sync(fd->get(), tmp_path);
      if (absl::Status closed = fd->Close(tmp_path); !closed.ok() && st.ok()) st = closed;
    }
    if (st.ok()) st = fs_.Rename(dir, tmp, dir, name, /*exchange=*/false, tmp_path);
    if (!st.ok()) {
      fs_.Remove(dir, tmp, false, tmp_path).IgnoreError();
      return Annotate(st, key);
    }
    if (durable_) {
      if (st = fs_.Sync(dir, dir_); !st.ok()) return Annotate(st, key);
    }
    return absl::OkStatus();
  }

  FileSystem& fs_;
  const std::string dir_;
  const std::string lock_path_;
  const bool durable_;
  const std::string label_;  // "FileStore <dir>", the prefix of every error
};

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> OpenFileStoreOn(std::string dir, bool durable,
                                                       FileSystem& fs) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return ErrnoStatus(ec.value(), absl::StrCat("FileStore ", dir, ": cannot create directory"));
  }
  auto store = std::make_unique<FileStore>(dir, durable, fs);
  if (absl::Status st = store->Prepare(); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat(store->label(), ": ", st.message()));
  }
  return std::unique_ptr<Store>(std::move(store));
}

absl::StatusOr<std::unique_ptr<Store>> OpenFileStore(std::string dir, bool durable) {
  return OpenFileStoreOn(std::move(dir), durable, RealFileSystem());
}

}  // namespace omni::internal
