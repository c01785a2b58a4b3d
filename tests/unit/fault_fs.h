// A fault-injecting FileSystem for tests (as leveldb's FaultInjectionTestEnv):
// fails the n-th operation with a chosen errno, or "crashes" at it (that
// operation and every later one fail with EIO), and then SimulateCrash()
// undoes what a power cut would have lost:
//  - a file written (or created, truncated) since its last fsync gets back
//    the contents it had at that fsync, or loses them all if it never had one;
//  - a directory entry created, renamed or removed since the last fsync of
//    its directory is undone (in reverse order; a directory whose creation
//    is undone disappears with everything in it).
//
// Operations are numbered from 0 since the last Arm(), in the order they
// are called (every call of the FileSystem interface is one operation).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/fs.h"

namespace omni::testing {

class FaultFileSystem final : public internal::FileSystem {
 public:
  enum class Mode { kNone, kFail, kCrash };

  // `stash`: an empty directory on the same file system as the files under
  // test (removed files are kept there, hard-linked, to be restored).
  explicit FaultFileSystem(std::string stash);

  void Arm(Mode mode, int64_t at, int err = EIO);
  // Refuses every mutating operation (create or open for writing, write,
  // fsync, rename, remove, mkdir, direct I/O) with EROFS while set, counting
  // them (a read-only directory, as root cannot otherwise get one).
  void RefuseMutations(bool refuse);
  int64_t refused() const;
  int64_t ops() const;
  bool fired() const;
  // Undoes what was not durable (see above), under the directory `root`.
  void SimulateCrash(const std::string& root);

  absl::StatusOr<internal::Fd> OpenDir(int dir, const std::string& name,
                                       const std::string& path) override;
  absl::StatusOr<internal::Fd> OpenWrite(int dir, const std::string& name, bool truncate,
                                         bool exclusive, const std::string& path) override;
  absl::StatusOr<internal::Fd> OpenRead(int dir, const std::string& name,
                                        const std::string& path) override;
  absl::StatusOr<internal::FileStat> Stat(int dir, const std::string& name,
                                          const std::string& path) override;
  absl::Status Write(int fd, const void* data, size_t n, uint64_t offset,
                     const std::string& path) override;
  absl::Status Sync(int fd, const std::string& path) override;
  absl::Status Rename(int from_dir, const std::string& from, int to_dir, const std::string& to,
                      bool exchange, const std::string& path) override;
  absl::Status Remove(int dir, const std::string& name, bool directory,
                      const std::string& path) override;
  absl::Status Mkdir(int dir, const std::string& name, const std::string& path) override;
  absl::StatusOr<std::vector<internal::DirEntry>> List(int dir, const std::string& path) override;
  // Forwarded to the real file system (one operation, which can fail).
  absl::Status SetDirectIo(int fd, bool on, const std::string& path) override;

 private:
  using Key = std::pair<uint64_t, uint64_t>;  // (device, inode)
  enum class Op { kCreateFile, kMkdir, kRename, kExchange, kRemoveFile, kRemoveDir };
  struct DirOp {
    Op op;
    std::string dir;                  // absolute path of the directory (at the time of the op)
    std::string name;                 // entry in it
    std::string to_dir, to_name;      // rename / exchange
    Key dir_key, to_key;              // the directories themselves (renamed since, maybe)
    std::string stash;                // a removed or replaced file, hard-linked
    bool replaced_empty_dir = false;  // a rename replaced an empty directory
    std::set<Key> unsynced;           // directories whose fsync makes it durable
  };

  absl::Status Before(const char* what, const std::string& path);
  // Before, for the mutating operations.
  absl::Status BeforeMutation(const char* what, const std::string& path);
  std::string StashName();
  void Record(DirOp op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Where the directory `key` is now under `root` (`recorded` when not found).
  static std::string WhereNow(const std::string& root, Key key, const std::string& recorded);

  internal::FileSystem& real_;
  const std::string stash_dir_;
  mutable absl::Mutex mu_;
  Mode mode_ ABSL_GUARDED_BY(mu_) = Mode::kNone;
  int64_t at_ ABSL_GUARDED_BY(mu_) = -1;
  int err_ ABSL_GUARDED_BY(mu_) = EIO;
  int64_t ops_ ABSL_GUARDED_BY(mu_) = 0;
  bool fired_ ABSL_GUARDED_BY(mu_) = false;
  bool refuse_mutations_ ABSL_GUARDED_BY(mu_) = false;
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t stashed_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<DirOp> pending_ ABSL_GUARDED_BY(mu_);
  std::set<Key> dirty_ ABSL_GUARDED_BY(mu_);
  std::map<Key, std::string> synced_ ABSL_GUARDED_BY(mu_);
};

}  // namespace omni::testing
