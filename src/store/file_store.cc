// FileStore: omni::Store in a directory (file_store.h), opened by OpenStore
// for file:///abs/dir. All its file I/O goes through the file-system seam
// (common/fs.h), so tests fail or crash any operation (tests/unit/fault_fs.h).
//
// Layout in its directory:
//
//   <dir>/.lock          flock'ed shared by every write, exclusive by whoever
//                        must hold every writer off (a backup of the
//                        directory; the soak test's store stalls).
//   <dir>/.lock.k-<encoded>
//                        flock'ed exclusive around every write of its key
//                        (Set, Add, CompareAndSet, Delete), so read-modify-
//                        write is atomic across processes; the kernel drops
//                        it when a holder dies. Kept when the key is deleted.
//   <dir>/k-<encoded>    one file per key, its contents the value. The key is
//                        encoded with '/' -> '%' and '.' -> '+' (neither is a
//                        key character, so the encoding is injective): a name
//                        never contains '/' or '.', so it is never ".", "..",
//                        a path, a lock file or a temporary.
//   <dir>/k-<encoded>.tmp.<pid>
//                        the next value of a key while it is written; only
//                        under the key's lock, so one found while holding
//                        that lock is a dead writer's and is removed at open.
//
// The lock is per key, not one for the directory, because a writer can be
// frozen while it holds it (SIGSTOP, a debugger, a VM paused, a process
// swapped out): with one lock every replica's heartbeat then waited for the
// frozen one, and the group could not evict it. A frozen writer now holds
// up only the key it was writing (its own heartbeat, most of the time);
// reads never wait. Opening the store skips a temporary whose key's lock is
// held rather than waiting for it.
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
// Besides the flock, writers of one key in one process serialise on a
// mutex of that key: on NFS, Linux emulates flock with POSIX record locks,
// which are owned by the process and so do not exclude threads of one
// process (and the temporary name is per process). For the same reason the
// shared <dir>/.lock only holds writers off reliably on a local file system.
#include "store/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/fs.h"
#include "omni/store.h"
#include "store/poll.h"

namespace omni::internal {
namespace {

// How long a writer waits for a lock. Holders only do a few small file
// operations, and a dead holder's lock is dropped by the kernel, so this
// only trips on a hung file system or a holder frozen mid-write.
constexpr absl::Duration kLockTimeout = absl::Seconds(60);

// Longest value the store keeps (a store holds small records; this bounds
// what a reader allocates for a file planted in the directory).
constexpr size_t kMaxValueBytes = size_t{64} << 20;

constexpr char kStoreLock[] = ".lock";
// The file Prepare creates to check that the directory is writable.
constexpr char kProbe[] = ".probe";

// One mutex per lock file path, for the writers of this process (see the
// file comment); an entry lives while a thread holds or waits for it.
class PathMutexes {
 public:
  struct Entry {
    absl::Mutex mu;
    int users = 0;  // guarded by the registry's mutex
  };

  static PathMutexes& Get() {
    static PathMutexes registry;  // threads are joined before exit
    return registry;
  }

  Entry* Use(const std::string& path) {
    absl::MutexLock l(&mu_);
    std::unique_ptr<Entry>& e = entries_[path];
    if (e == nullptr) e = std::make_unique<Entry>();
    ++e->users;
    return e.get();
  }

  void Release(const std::string& path) {
    absl::MutexLock l(&mu_);
    auto it = entries_.find(path);
    if (it != entries_.end() && --it->second->users == 0) entries_.erase(it);
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
};

// An flock on one lock file (shared or exclusive), with the mutex of its
// path for the exclusive ones; both are released on destruction (closing the
// fd drops the flock).
class FileLock {
 public:
  enum class Wait { kUpTo60s, kNo };

  // Takes the lock file `name` under the directory `dir` (created if
  // missing). With Wait::kNo, nullptr when another holder has it.
  static absl::StatusOr<std::unique_ptr<FileLock>> Acquire(FileSystem& fs, int dir,
                                                           const std::string& name,
                                                           const std::string& path, bool exclusive,
                                                           Wait wait) {
    auto lock = std::make_unique<FileLock>(path, exclusive);
    if (exclusive) {
      if (wait == Wait::kNo) {
        if (!lock->entry_->mu.TryLock()) return nullptr;
      } else {
        lock->entry_->mu.Lock();
      }
      lock->mu_held_ = true;
    }
    absl::StatusOr<Fd> fd = fs.OpenWrite(dir, name, /*truncate=*/false, /*exclusive=*/false, path);
    if (!fd.ok()) return fd.status();
    lock->fd_ = *std::move(fd);
    auto try_lock = [&]() -> absl::StatusOr<bool> {
      for (;;) {
        if (::flock(lock->fd_.get(), (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) == 0) return true;
        if (errno == EINTR) continue;
        if (errno == EWOULDBLOCK) return false;
        return ErrnoStatus(errno, absl::StrCat("flock ", path));
      }
    };
    absl::StatusOr<bool> locked =
        wait == Wait::kNo ? try_lock() : PollUntil(kLockTimeout, try_lock);
    if (!locked.ok()) return locked.status();
    if (!*locked) {
      if (wait == Wait::kNo) return nullptr;
      return absl::DeadlineExceededError(absl::StrCat("lock file ", path, " still held after ",
                                                      absl::FormatDuration(kLockTimeout)));
    }
    return lock;
  }

  // Use Acquire.
  FileLock(std::string path, bool exclusive)
      : path_(std::move(path)), entry_(exclusive ? PathMutexes::Get().Use(path_) : nullptr) {}

  ~FileLock() {
    fd_.Reset();  // drops the flock before the mutex
    if (entry_ == nullptr) return;
    if (mu_held_) entry_->mu.Unlock();
    PathMutexes::Get().Release(path_);
  }

  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  const std::string path_;
  PathMutexes::Entry* const entry_;  // exclusive locks only
  bool mu_held_ = false;
  Fd fd_;
};

// The directory and the locks of one write: the store's, shared, then the
// key's, exclusive (always in this order).
struct Locked {
  Fd dir;
  std::unique_ptr<FileLock> store;
  std::unique_ptr<FileLock> key;
};

class FileStore final : public Store {
 public:
  FileStore(std::string dir, bool durable, FileSystem& fs)
      : fs_(fs),
        dir_(std::move(dir)),
        durable_(durable),
        label_(absl::StrCat("FileStore ", dir_)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    if (absl::Status st = Check(key, value); !st.ok()) return st;
    absl::StatusOr<Locked> locked = Lock(key);
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
    absl::StatusOr<Locked> locked = Lock(key);
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
    absl::StatusOr<Locked> locked = Lock(key);
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
    absl::StatusOr<Locked> locked = Lock(key);
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

  // Removes the temporaries of writers that died mid-write (a live writer
  // holds its key's lock until its temporary is gone, so one whose key's
  // lock is free is a dead writer's; one whose lock is held is skipped, not
  // waited for: its writer may be frozen) and checks that a file can be
  // created here, so that an unusable directory fails at open rather than at
  // the first Set.
  absl::Status Prepare() {
    absl::StatusOr<Fd> dir = OpenDir();
    if (!dir.ok()) return dir.status();
    absl::StatusOr<std::unique_ptr<FileLock>> shared = LockStore(dir->get());
    if (!shared.ok()) return shared.status();
    absl::StatusOr<std::vector<DirEntry>> entries = fs_.List(dir->get(), dir_);
    if (!entries.ok()) return entries.status();
    for (const DirEntry& e : *entries) {
      const size_t tmp = e.name.find(".tmp.");
      if (e.type != FileType::kRegular || tmp == std::string::npos) continue;
      // A probe (below) has no lock: its opener tolerates its removal.
      std::unique_ptr<FileLock> key;
      if (!absl::StartsWith(e.name, kProbe)) {
        const std::string lock_name = LockNameOf(e.name.substr(0, tmp));
        absl::StatusOr<std::unique_ptr<FileLock>> held = FileLock::Acquire(
            fs_, dir->get(), lock_name, PathOf(lock_name), /*exclusive=*/true, FileLock::Wait::kNo);
        if (!held.ok()) return held.status();
        if (*held == nullptr) continue;  // its writer is alive
        key = *std::move(held);
      }
      if (absl::Status st = fs_.Remove(dir->get(), e.name, false, PathOf(e.name));
          !st.ok() && !absl::IsNotFound(st)) {
        return st;
      }
    }
    // One name per opening: other threads of this process may open the
    // store at the same time (nothing here is exclusive). A probe has no
    // key's lock, so whoever opens the store beside us may remove it first.
    static std::atomic<uint64_t> openings{0};
    const std::string probe = absl::StrCat(kProbe, ".tmp.", ::getpid(), ".", openings.fetch_add(1));
    absl::StatusOr<Fd> fd = fs_.OpenWrite(dir->get(), probe, /*truncate=*/true,
                                          /*exclusive=*/false, PathOf(probe));
    if (!fd.ok()) {
      return absl::Status(fd.status().code(),
                          absl::StrCat("directory is not writable: ", fd.status().message()));
    }
    fd->Reset();
    absl::Status removed = fs_.Remove(dir->get(), probe, false, PathOf(probe));
    return absl::IsNotFound(removed) ? absl::OkStatus() : removed;
  }

  const std::string& label() const { return label_; }

 private:
  static std::string NameOf(const std::string& key) {
    std::string name = "k-" + key;
    std::replace(name.begin(), name.end(), '/', '%');
    std::replace(name.begin(), name.end(), '.', '+');
    return name;
  }

  // The lock file of the key file `name` (a name never contains '.', so
  // this is never a key's file or a temporary).
  static std::string LockNameOf(const std::string& name) {
    return absl::StrCat(kStoreLock, ".", name);
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

  absl::StatusOr<std::unique_ptr<FileLock>> LockStore(int dir) {
    return FileLock::Acquire(fs_, dir, kStoreLock, PathOf(kStoreLock), /*exclusive=*/false,
                             FileLock::Wait::kUpTo60s);
  }

  // The locks of a write of `key` (see Locked).
  absl::StatusOr<Locked> Lock(const std::string& key) {
    Locked locked;
    absl::StatusOr<Fd> dir = OpenDir();
    if (!dir.ok()) return dir.status();
    locked.dir = *std::move(dir);
    absl::StatusOr<std::unique_ptr<FileLock>> shared = LockStore(locked.dir.get());
    if (!shared.ok()) return shared.status();
    locked.store = *std::move(shared);
    const std::string name = LockNameOf(NameOf(key));
    absl::StatusOr<std::unique_ptr<FileLock>> own = FileLock::Acquire(
        fs_, locked.dir.get(), name, PathOf(name), /*exclusive=*/true, FileLock::Wait::kUpTo60s);
    if (!own.ok()) return own.status();
    locked.key = *std::move(own);
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
