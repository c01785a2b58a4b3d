// FileStore: omni::Store in a directory (file_store.h), opened by OpenStore
// for file:///abs/dir.
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
//                        a path, the lock file or a temporary of
//                        WriteFileAtomic (which ends in ".tmp.<pid>").
//
// Every value is replaced atomically (temporary, rename; not fsynced), so a reader
// needs no lock: it sees either the old or the new file.
//
// Besides the flock, writers of one process serialise on a process-wide
// mutex: on NFS, Linux emulates flock with POSIX record locks, which are
// owned by the process and so do not exclude threads of one process (and
// WriteFileAtomic's temporary name is per process).
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

// Writers of this process, around the flock (see the file comment).
ABSL_CONST_INIT absl::Mutex g_writer_mu(absl::kConstInit);

// Holds g_writer_mu and an exclusive flock on a lock file; both are released
// on destruction (closing the fd drops the flock).
class DirLock {
 public:
  // Takes the lock on `path` (created if missing), retrying for at most
  // kLockTimeout.
  static absl::StatusOr<std::unique_ptr<DirLock>> Acquire(const std::string& path) {
    auto lock = std::make_unique<DirLock>(path);
    if (lock->fd_.get() < 0) {
      return ErrnoStatus(lock->open_errno_, absl::StrCat("open lock file ", path));
    }
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

  // Takes g_writer_mu and opens `path`; use Acquire.
  explicit DirLock(const std::string& path)
      : hold_(&g_writer_mu),
        fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)),
        open_errno_(errno) {}

 private:
  absl::MutexLock hold_;  // declared first: released last
  Fd fd_;
  int open_errno_;  // meaningful when fd_ < 0
};

class FileStore final : public Store {
 public:
  explicit FileStore(std::string dir)
      : dir_(std::move(dir)),
        lock_path_(dir_ + "/.lock"),
        label_(absl::StrCat("FileStore ", dir_)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    if (absl::Status st = ValidateStoreKey(key); !st.ok()) return st;
    absl::StatusOr<std::unique_ptr<DirLock>> lock = Lock(key);
    if (!lock.ok()) return lock.status();
    return Write(key, value);
  }

  absl::StatusOr<std::optional<std::string>> TryGet(const std::string& key) override {
    if (absl::Status st = ValidateStoreKey(key); !st.ok()) return st;
    return Read(key);
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    if (absl::Status st = ValidateStoreKey(key); !st.ok()) return st;
    absl::StatusOr<std::unique_ptr<DirLock>> lock = Lock(key);
    if (!lock.ok()) return lock.status();
    absl::StatusOr<std::optional<std::string>> current = Read(key);
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
    if (absl::Status st = Write(key, absl::StrCat(sum)); !st.ok()) return st;
    return sum;
  }

  absl::StatusOr<std::string> CompareAndSet(const std::string& key, const std::string& expected,
                                            const std::string& desired) override {
    if (absl::Status st = ValidateStoreKey(key); !st.ok()) return st;
    absl::StatusOr<std::unique_ptr<DirLock>> lock = Lock(key);
    if (!lock.ok()) return lock.status();
    absl::StatusOr<std::optional<std::string>> current = Read(key);
    if (!current.ok()) return current.status();
    const bool matches =
        current->has_value() ? !expected.empty() && **current == expected : expected.empty();
    if (!matches) {
      if (current->has_value()) return std::move(**current);
      return absl::NotFoundError(
          absl::StrCat(label_, ": compare-and-set of missing key '", key, "' expected a value"));
    }
    if (absl::Status st = Write(key, desired); !st.ok()) return st;
    return desired;
  }

  absl::StatusOr<bool> Delete(const std::string& key) override {
    if (absl::Status st = ValidateStoreKey(key); !st.ok()) return st;
    absl::StatusOr<std::unique_ptr<DirLock>> lock = Lock(key);
    if (!lock.ok()) return lock.status();
    const std::string path = PathOf(key);
    if (::unlink(path.c_str()) == 0) return true;
    if (errno == ENOENT) return false;
    return Annotate(ErrnoStatus(errno, absl::StrCat("unlink ", path)), key);
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    return internal::PollGet(*this, key, timeout, label_);
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    return internal::PollWait(*this, keys, timeout, label_);
  }

 private:
  std::string PathOf(const std::string& key) const {
    std::string name = "k-" + key;
    std::replace(name.begin(), name.end(), '/', '%');
    std::replace(name.begin(), name.end(), '.', '+');
    return absl::StrCat(dir_, "/", name);
  }

  // `st` with the same code, its message prefixed with the store and key.
  absl::Status Annotate(const absl::Status& st, const std::string& key) const {
    return absl::Status(st.code(), absl::StrCat(label_, ": key '", key, "': ", st.message()));
  }

  absl::StatusOr<std::unique_ptr<DirLock>> Lock(const std::string& key) const {
    absl::StatusOr<std::unique_ptr<DirLock>> lock = DirLock::Acquire(lock_path_);
    if (!lock.ok()) return Annotate(lock.status(), key);
    return lock;
  }

  absl::StatusOr<std::optional<std::string>> Read(const std::string& key) const {
    const std::string path = PathOf(key);
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == ENOENT) return std::optional<std::string>();
      return Annotate(ErrnoStatus(errno, absl::StrCat("open ", path)), key);
    }
    std::string value;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
      if (n == 0) break;
      if (n < 0) {
        if (errno == EINTR) continue;
        return Annotate(ErrnoStatus(errno, absl::StrCat("read ", path)), key);
      }
      value.append(buf, static_cast<size_t>(n));
    }
    return std::optional<std::string>(std::move(value));
  }

  // REQUIRES: the directory lock is held. Not fsynced: a store lives as
  // long as its job's processes (a host crash ends them too), and at 10..100
  // writes per second (heartbeats) fsyncs would serialise every writer
  // behind the disk.
  absl::Status Write(const std::string& key, const std::string& value) const {
    absl::Status st = internal::WriteFileAtomic(PathOf(key), value, /*durable=*/false);
    return st.ok() ? st : Annotate(st, key);
  }

  const std::string dir_;
  const std::string lock_path_;
  const std::string label_;  // "FileStore <dir>", the prefix of every error
};

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> OpenFileStore(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return ErrnoStatus(ec.value(), absl::StrCat("FileStore ", dir, ": cannot create directory"));
  }
  // Creates the lock file and probes for a writable directory, so that an
  // unusable directory fails here rather than at the first Set.
  {
    Fd fd(::open(absl::StrCat(dir, "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (fd.get() < 0) {
      return ErrnoStatus(errno, absl::StrCat("FileStore ", dir, ": cannot open the lock file"));
    }
  }
  if (absl::Status st = internal::CheckWritableDir(absl::StrCat(dir, "/.lock")); !st.ok()) {
    return absl::Status(
        st.code(), absl::StrCat("FileStore ", dir, ": directory is not writable: ", st.message()));
  }
  return std::unique_ptr<Store>(std::make_unique<FileStore>(std::move(dir)));
}

}  // namespace omni::internal
