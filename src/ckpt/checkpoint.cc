// The per-rank CheckpointManager (omni/checkpoint.h): saves (synchronous and
// in the background), the commit through rank 0, retention, clean-up and
// restore. The manifest's format is ckpt/rank_manifest.h; reading, checking
// and listing step directories ckpt/rank_reader.h.
#include "omni/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "ckpt/checkpoint_fs.h"
#include "ckpt/ckpt_util.h"
#include "ckpt/manifest_fields.h"
#include "ckpt/rank_manifest.h"
#include "ckpt/rank_reader.h"
#include "ckpt/safetensors.h"
#include "ckpt/state_snapshot.h"
#include "ckpt/step_dirs.h"
#include "common/fs.h"
#include "common/strings.h"
#include "common/thread_name.h"
#include "omni/hash.h"
#include "omni/version.h"

namespace omni {
namespace {

using internal::Guard;
using internal::NowUnixMs;
using internal::Poller;
using internal::RandomId;
using internal::Seconds;
// The longest wait between two looks for the other ranks' files (Poller).
constexpr absl::Duration kPollMax = absl::Milliseconds(50);

using ckpt::Fd;
using ckpt::Join;
using ckpt::ShardSummary;
using ckpt::StepDirName;
using ckpt::StepDirs;
using ckpt::StepName;
using ckpt::TensorEntry;
using internal::ErrnoStatus;
using Metadata = std::map<std::string, std::string>;

using ckpt::rank::CheckStep;
using ckpt::rank::FragmentJson;
using ckpt::rank::FragmentName;
using ckpt::rank::kFormat;
using ckpt::rank::kManifest;
using ckpt::rank::LoadStep;
using ckpt::rank::Manifest;
using ckpt::rank::ManifestJson;
using ckpt::rank::OpenCheckedShard;
using ckpt::rank::ParseFragment;
using ckpt::rank::ScanAt;
using ckpt::rank::ShardFileName;
using ckpt::rank::ShardRecord;
using ckpt::rank::StepDir;

constexpr const char* kAborted = "ABORTED";
constexpr const char* kTmpPrefix = ".tmp-step-";
// Tries at making a step's temporary directory and this rank's shard in it
// (CheckpointManagerImpl::Write).
constexpr int kTmpDirAttempts = 4;
constexpr const char* kTrashPrefix = ".trash-";
constexpr int64_t kMaxStep = 999'999'999'999;  // 12 digits
constexpr uint64_t kDefaultHeaderReserve = uint64_t{1} << 20;

// ---------------------------------------------------------------- names

std::string TmpDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), ".tmp-step-%012" PRId64, step);
  return buf;
}

std::string LockName(int rank) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), ".lock-rank-%05d", rank);
  return buf;
}

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The rank owning a file of a temporary directory: "rank-00003.*" → 3;
// the manifest and the abort marker belong to rank 0; -1 otherwise.
int OwnerOf(std::string_view name) {
  if (name.size() > 11 && name.substr(0, 5) == "rank-" && AllDigits(name.substr(5, 5)) &&
      name[10] == '.') {
    return std::stoi(std::string(name.substr(5, 5)));
  }
  if (name.substr(0, std::strlen(kManifest)) == kManifest || name == kAborted) return 0;
  return -1;
}

// ---------------------------------------------------------------- small I/O
//
// Everything goes through a FileSystem, relative to an open directory, never
// following a symbolic link (see common/fs.h).

using internal::DirEntry;
using internal::FileStat;
using internal::FileSystem;
using internal::FileType;

absl::StatusOr<std::vector<std::string>> ListDir(FileSystem& fs, int dir, const std::string& path) {
  absl::StatusOr<std::vector<DirEntry>> entries = fs.List(dir, path);
  if (!entries.ok()) return entries.status();
  std::vector<std::string> out;
  out.reserve(entries->size());
  for (DirEntry& e : *entries) out.push_back(std::move(e.name));
  return out;
}

void RemoveTree(FileSystem& fs, int dir, const std::string& name, const std::string& path) {
  internal::RemoveTreeAt(fs, dir, name, path).IgnoreError();  // best effort
}

bool Exists(FileSystem& fs, int dir, const std::string& name) {
  return fs.Stat(dir, name, name).ok();
}

// ---------------------------------------------------------------- snapshot

// A state copied into host memory, written later by the background thread.
struct Snapshot {
  int64_t step = 0;
  Metadata metadata;
  ckpt::StateSnapshot state;
};

// ---------------------------------------------------------------- the manager

class CheckpointManagerImpl final : public CheckpointManager {
 public:
  CheckpointManagerImpl(CheckpointOptions options, FileSystem& fs, Fd dir, Fd lock,
                        struct timespec session, ckpt::DirectIoOptions direct)
      : opt_(std::move(options)),
        fs_(fs),
        dir_(std::move(dir)),
        lock_(std::move(lock)),
        session_(session),
        direct_(direct) {
    direct_.enabled = direct_.enabled && opt_.direct_io;
  }
  ~CheckpointManagerImpl() override;

  absl::Status CleanUp();
  void LearnHeaderReserve();

  absl::StatusOr<SaveStats> Save(int64_t step, const StateRegistry& state,
                                 const Metadata& metadata) override;
  absl::StatusOr<SaveStats> SaveAsync(int64_t step, const StateRegistry& state,
                                      const Metadata& metadata) override;
  absl::Status WaitForPending(absl::Duration timeout) override;
  absl::StatusOr<std::vector<CheckpointInfo>> List() const override;
  absl::StatusOr<RestoreResult> Restore(const StateRegistry& state,
                                        std::optional<int64_t> step) override;

 private:
  using Fill = std::function<absl::Status(ckpt::ShardWriter&)>;
  std::string PathOf(const std::string& name) const { return Join(opt_.dir, name); }
  // Writes this rank's shard for `step` and takes part in the commit.
  absl::StatusOr<SaveStats> Write(int64_t step, const Metadata& metadata, const Fill& fill,
                                  const std::vector<TensorEntry>* plan);
  absl::Status CommitRank0(int64_t step, int tmp_fd, const std::string& tmp,
                           const Metadata& metadata, const ShardRecord& mine,
                           std::vector<TensorEntry> my_entries);
  absl::Status WaitForCommit(int64_t step, int tmp_fd, const std::string& tmp,
                             const ShardRecord& mine);
  absl::Status Publish(const std::string& tmp_name, const std::string& final_name);
  void RemoveOwnFiles(int tmp_fd, const std::string& tmp) const;
  void AbortTmp(int tmp_fd, const std::string& tmp_name) const;
  void ApplyRetention(int64_t saved_step);
  void DeleteLater(const std::string& name);
  void RemoveAbortedTmpDirs(int64_t except_step);
  absl::Status CheckStepNumber(int64_t step) const;
  // FailedPrecondition when read-only.
  absl::Status CheckWritable() const;
  // Waits until no asynchronous save is pending (the latched error stays).
  void WaitIdle();
  void WorkerLoop();
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !pending_; }
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return job_ != nullptr || !trash_.empty() || stop_;
  }
  void StartWorker() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!worker_.joinable())
      worker_ = std::thread([this] {
        internal::NameThisThread("omni-ckpt-write");
        WorkerLoop();
      });
  }

  const CheckpointOptions opt_;
  FileSystem& fs_;
  const Fd dir_;  // opt_.dir: every name below is opened relative to it
  Fd lock_;
  const struct timespec session_;  // the lock file's mtime at Open (rank 0)
  ckpt::DirectIoOptions direct_;   // how shards are written
  std::atomic<uint64_t> header_reserve_{kDefaultHeaderReserve};

  absl::Mutex mu_;
  bool pending_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<Snapshot> job_ ABSL_GUARDED_BY(mu_);
  absl::Status latched_ ABSL_GUARDED_BY(mu_);
  // Directories (names under dir_) renamed out of the way by retention,
  // deleted in the background (deleting a large file takes tens of
  // milliseconds).
  std::vector<std::string> trash_ ABSL_GUARDED_BY(mu_);
  // The memory of the last snapshot, for the next one (keep_snapshot_memory).
  std::vector<ckpt::HostBlock> spare_ ABSL_GUARDED_BY(mu_);
  // Steps this manager committed or found valid: retention checks each step
  // directory once, not on every save.
  std::set<int64_t> known_valid_ ABSL_GUARDED_BY(mu_);
  std::thread worker_ ABSL_GUARDED_BY(mu_);  // started on first use
};

bool TimespecBefore(const struct timespec& a, const struct timespec& b) {
  return a.tv_sec != b.tv_sec ? a.tv_sec < b.tv_sec : a.tv_nsec < b.tv_nsec;
}

CheckpointManagerImpl::~CheckpointManagerImpl() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  std::thread worker;
  {
    absl::MutexLock l(&mu_);
    worker = std::move(worker_);
  }
  // The worker finishes a pending write and the deletions first.
  if (worker.joinable()) worker.join();
}

absl::Status CheckpointManagerImpl::CheckWritable() const {
  if (!opt_.read_only) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("checkpoint directory ", opt_.dir,
                   " was opened read-only (CheckpointOptions::read_only): saving is refused"));
}

absl::Status CheckpointManagerImpl::CheckStepNumber(int64_t step) const {
  if (step < 0 || step > kMaxStep) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint step ", step, " is outside [0, ", kMaxStep, "]"));
  }
  return absl::OkStatus();
}

// Files of crashed writers: in temporary directories, what belongs to this
// rank (its lock is ours now), and for rank 0 the manifest and abort marker,
// files of ranks outside the world whose lock is free, and directories that
// were being deleted. A temporary or trash entry that is not a directory (a
// symbolic link planted there, say) is refused: FailedPrecondition naming it,
// its target untouched.
absl::Status CheckpointManagerImpl::CleanUp() {
  absl::StatusOr<std::vector<DirEntry>> names = fs_.List(dir_.get(), opt_.dir);
  if (!names.ok()) return names.status();
  for (const DirEntry& e : *names) {
    const std::string& name = e.name;
    const bool tmp = name.rfind(kTmpPrefix, 0) == 0;
    const bool trash = name.rfind(kTrashPrefix, 0) == 0;
    if (!tmp && !trash) continue;
    const std::string path = PathOf(name);
    if (e.type != FileType::kDirectory) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint directory ", opt_.dir, ": ", name, " is ",
          e.type == FileType::kSymlink ? "a symbolic link" : "not a directory",
          "; not followed or emptied (nothing in a checkpoint directory may lead out of it): "
          "remove it"));
    }
    if (trash) {
      if (opt_.rank == 0) RemoveTree(fs_, dir_.get(), name, path);
      continue;
    }
    absl::StatusOr<Fd> tmp_fd = fs_.OpenDir(dir_.get(), name, path);
    if (!tmp_fd.ok()) return tmp_fd.status();
    absl::StatusOr<std::vector<std::string>> files = ListDir(fs_, tmp_fd->get(), path);
    if (!files.ok()) continue;
    for (const std::string& f : *files) {
      const int owner = OwnerOf(f);
      bool remove = owner == opt_.rank || (opt_.world_size == 1 && owner < 0);
      if (!remove && opt_.rank == 0 && owner >= opt_.world_size) {
        // A rank of an earlier, larger world: its files are orphaned when
        // no live process holds its lock.
        absl::StatusOr<Fd> other = fs_.OpenRead(dir_.get(), LockName(owner), LockName(owner));
        remove = !other.ok() ? absl::IsNotFound(other.status())
                             : ::flock(other->get(), LOCK_EX | LOCK_NB) == 0;
      }
      if (remove) RemoveTree(fs_, tmp_fd->get(), f, Join(path, f));
    }
    fs_.Remove(dir_.get(), name, /*directory=*/true, path).IgnoreError();  // only when empty
  }
  return absl::OkStatus();
}

void CheckpointManagerImpl::LearnHeaderReserve() {
  absl::StatusOr<std::vector<StepName>> dirs = StepDirs(fs_, dir_.get(), opt_.dir);
  if (!dirs.ok()) return;
  for (const StepName& d : *dirs) {
    absl::StatusOr<Fd> sd = fs_.OpenDir(dir_.get(), d.name, d.path);
    if (!sd.ok()) continue;
    absl::StatusOr<uint64_t> n = ckpt::HeaderJsonBytes(fs_, sd->get(), ShardFileName(opt_.rank),
                                                       Join(d.path, ShardFileName(opt_.rank)));
    if (!n.ok()) continue;
    header_reserve_ = ckpt::HeaderBytesFor(*n + *n / 4 + 4096);
    return;
  }
}

void CheckpointManagerImpl::RemoveOwnFiles(int tmp_fd, const std::string& tmp) const {
  absl::StatusOr<std::vector<std::string>> files = ListDir(fs_, tmp_fd, tmp);
  if (!files.ok()) return;
  for (const std::string& f : *files) {
    const int owner = OwnerOf(f);
    if (owner == opt_.rank || (opt_.world_size == 1)) RemoveTree(fs_, tmp_fd, f, Join(tmp, f));
  }
}

// After a failed save: remove what this rank wrote; rank 0 tells the others.
void CheckpointManagerImpl::AbortTmp(int tmp_fd, const std::string& tmp_name) const {
  const std::string tmp = PathOf(tmp_name);
  if (opt_.world_size == 1) {
    RemoveTree(fs_, dir_.get(), tmp_name, tmp);
    return;
  }
  if (tmp_fd >= 0) {
    RemoveOwnFiles(tmp_fd, tmp);
    if (opt_.rank == 0) {
      fs_.OpenWrite(tmp_fd, kAborted, false, false, Join(tmp, kAborted)).IgnoreError();
    }
  }
  fs_.Remove(dir_.get(), tmp_name, /*directory=*/true, tmp).IgnoreError();  // only when empty
}

absl::Status CheckpointManagerImpl::Publish(const std::string& tmp_name,
                                            const std::string& final_name) {
  const std::string what = absl::StrCat(PathOf(tmp_name), " -> ", PathOf(final_name));
  absl::Status st = fs_.Rename(dir_.get(), tmp_name, dir_.get(), final_name, false, what);
  if (st.ok() || !absl::IsAlreadyExists(st)) return st;
  // A checkpoint of this step exists: swap atomically, then delete the old
  // one (now under the temporary name, which Open cleans up after a crash).
  st = fs_.Rename(dir_.get(), tmp_name, dir_.get(), final_name, true, what);
  if (st.ok()) {
    DeleteLater(tmp_name);
    return absl::OkStatus();
  }
  if (!absl::IsUnimplemented(st)) return st;
  // No RENAME_EXCHANGE on this file system: move the old one aside first.
  const std::string trash = absl::StrCat(kTrashPrefix, final_name, "-", ::getpid());
  if (absl::Status r = fs_.Rename(dir_.get(), final_name, dir_.get(), trash, false,
                                  absl::StrCat(PathOf(final_name), " -> ", PathOf(trash)));
      !r.ok()) {
    return r;
  }
  if (absl::Status r = fs_.Rename(dir_.get(), tmp_name, dir_.get(), final_name, false, what);
      !r.ok()) {
    fs_.Rename(dir_.get(), trash, dir_.get(), final_name, false, what).IgnoreError();
    return r;
  }
  RemoveTree(fs_, dir_.get(), trash, PathOf(trash));
  return absl::OkStatus();
}

absl::StatusOr<SaveStats> CheckpointManagerImpl::Write(int64_t step, const Metadata& metadata,
                                                       const Fill& fill,
                                                       const std::vector<TensorEntry>* plan) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string tmp_name = TmpDirName(step);
  const std::string tmp = PathOf(tmp_name);
  const auto failed = [&](const absl::Status& st) {
    return absl::Status(st.code(), absl::StrCat("checkpoint step ", step, " in ", opt_.dir,
                                                " (rank ", opt_.rank, "): ", st.message()));
  };
  const Metadata shard_md = {{"format", kFormat},
                             {"step", std::to_string(step)},
                             {"rank", std::to_string(opt_.rank)},
                             {"world_size", std::to_string(opt_.world_size)},
                             {"job_id", opt_.job_id},
                             {"save_id", HexDigest(RandomId())}};
  uint64_t reserve = header_reserve_;
  if (plan != nullptr) reserve = ckpt::HeaderBytesFor(ckpt::HeaderJson(*plan, shard_md).size());

  const std::string shard_name = ShardFileName(opt_.rank);
  // The temporary directory and this rank's shard in it. Another rank that
  // opens its manager meanwhile (a replaced rank rejoining) removes the
  // directory while it is still empty, taking it for a crashed save's: it
  // is made again (a few times), and holds the shard once it is created.
  absl::StatusOr<Fd> tmp_fd = absl::UnknownError("not opened");
  absl::StatusOr<std::unique_ptr<ckpt::ShardWriter>> w = absl::UnknownError("not created");
  for (int attempt = 0; attempt < kTmpDirAttempts; ++attempt) {
    bool existed = false;
    if (absl::Status st = fs_.Mkdir(dir_.get(), tmp_name, tmp); !st.ok()) {
      if (!absl::IsAlreadyExists(st)) return failed(st);
      existed = true;
    }
    tmp_fd = fs_.OpenDir(dir_.get(), tmp_name, tmp);
    if (!tmp_fd.ok()) {  // e.g. a symbolic link planted under the temporary name: never followed
      if (absl::IsNotFound(tmp_fd.status())) continue;
      if (!existed) AbortTmp(-1, tmp_name);
      return failed(tmp_fd.status());
    }
    if (existed) RemoveOwnFiles(tmp_fd->get(), tmp);  // a failed attempt at this step
    w = ckpt::ShardWriter::Create(fs_, tmp_fd->get(), shard_name, Join(tmp, shard_name), reserve,
                                  direct_);
    if (!absl::IsNotFound(w.status())) break;
  }
  if (!tmp_fd.ok()) return failed(tmp_fd.status());
  absl::StatusOr<ShardSummary> summary = [&]() -> absl::StatusOr<ShardSummary> {
    if (!w.ok()) return w.status();
    if (absl::Status st = Guard("saving", [&] { return fill(**w); }); !st.ok()) return st;
    return (*w)->Finish(shard_md);
  }();
  absl::Status st = summary.status();
  ShardRecord mine;
  if (st.ok()) {
    header_reserve_ =
        ckpt::HeaderBytesFor(summary->header_json_bytes + summary->header_json_bytes / 4 + 4096);
    mine.rank = opt_.rank;
    mine.file = shard_name;
    mine.bytes = summary->file_bytes;
    mine.header_bytes = summary->header_bytes;
    mine.header_xxh3 = summary->header_xxh3;
    mine.xxh3 = summary->xxh3;
    if (opt_.rank == 0) {
      st = CommitRank0(step, tmp_fd->get(), tmp, metadata, mine, std::move(summary->entries));
    } else {
      // Written under a name rank 0 ignores, then renamed: rank 0 never
      // reads half a fragment.
      const std::string frag = FragmentName(opt_.rank);
      const std::string part = frag + ".part";
      st = internal::WriteFileSyncedAt(fs_, tmp_fd->get(), part,
                                       FragmentJson(step, mine, summary->entries), Join(tmp, part));
      if (st.ok()) {
        st = fs_.Rename(tmp_fd->get(), part, tmp_fd->get(), frag, false,
                        absl::StrCat(Join(tmp, part), " -> ", frag));
      }
      if (st.ok()) st = fs_.Sync(tmp_fd->get(), tmp);
      if (st.ok()) st = WaitForCommit(step, tmp_fd->get(), tmp, mine);
    }
  }
  if (!st.ok()) {
    AbortTmp(tmp_fd->get(), tmp_name);
    return failed(st);
  }
  SaveStats stats;
  stats.bytes = static_cast<int64_t>(mine.bytes);
  stats.write_s = Seconds(t0);
  if (opt_.rank == 0) {
    ApplyRetention(step);
    if (opt_.world_size > 1) RemoveAbortedTmpDirs(step);
  }
  return stats;
}

absl::Status CheckpointManagerImpl::CommitRank0(int64_t step, int tmp_fd, const std::string& tmp,
                                                const Metadata& metadata, const ShardRecord& mine,
                                                std::vector<TensorEntry> my_entries) {
  Manifest m;
  m.step = step;
  m.world_size = opt_.world_size;
  m.library_version = Version();
  m.job_id = opt_.job_id;
  m.metadata = metadata;
  m.shards.resize(opt_.world_size);
  m.entries.resize(opt_.world_size);
  m.shards[0] = mine;
  m.entries[0] = std::move(my_entries);
  if (opt_.world_size > 1) {
    fs_.Remove(tmp_fd, kAborted, false, Join(tmp, kAborted)).IgnoreError();
    std::vector<bool> have(opt_.world_size, false);
    have[0] = true;
    int missing = opt_.world_size - 1;
    Poller poll(opt_.shard_timeout, kPollMax);
    while (missing > 0) {
      for (int r = 1; r < opt_.world_size; ++r) {
        if (have[r]) continue;
        const std::string frag_name = FragmentName(r);
        const std::string frag = Join(tmp, frag_name);
        absl::StatusOr<FileStat> fst = fs_.Stat(tmp_fd, frag_name, frag);
        if (!fst.ok() || TimespecBefore(fst->mtime, session_)) {
          continue;  // not written yet, or left by a writer before this Open
        }
        absl::StatusOr<std::string> text =
            internal::ReadFileAt(fs_, tmp_fd, frag_name, frag, kMaxManifestBytes);
        if (!text.ok()) {
          if (absl::IsNotFound(text.status())) continue;
          return text.status();  // a symbolic link, a FIFO, too large: never waited out
        }
        if (absl::Status st = ParseFragment(*text, frag, step, r, m.shards[r], m.entries[r]);
            !st.ok()) {
          return st;
        }
        const std::string shard = Join(tmp, m.shards[r].file);
        absl::StatusOr<FileStat> sst = fs_.Stat(tmp_fd, m.shards[r].file, shard);
        if (!sst.ok() || sst->type != FileType::kRegular || sst->size != m.shards[r].bytes) {
          return absl::DataLossError(absl::StrCat(
              shard, ": missing, not a regular file or not of the size its fragment records"));
        }
        have[r] = true;
        --missing;
      }
      if (missing == 0) break;
      if (poll.Expired()) {
        std::vector<int> late;
        for (int r = 1; r < opt_.world_size; ++r) {
          if (!have[r]) late.push_back(r);
        }
        return absl::DeadlineExceededError(
            absl::StrCat("rank(s) ", absl::StrJoin(late, ","), " did not write their shard within ",
                         absl::FormatDuration(opt_.shard_timeout), " (waiting for ", tmp, "/",
                         FragmentName(late[0]), ")"));
      }
      poll.Wait();
    }
    for (int r = 1; r < opt_.world_size; ++r) {
      fs_.Remove(tmp_fd, FragmentName(r), false, Join(tmp, FragmentName(r))).IgnoreError();
    }
  }
  m.created_unix_ms = NowUnixMs();
  const std::string text = ManifestJson(m);
  if (text.size() > kMaxManifestBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(Join(tmp, kManifest), ": the manifest would take ", text.size(),
                     " bytes, more than the limit of ", kMaxManifestBytes, " a reader accepts"));
  }
  if (absl::Status st =
          internal::WriteFileSyncedAt(fs_, tmp_fd, kManifest, text, Join(tmp, kManifest));
      !st.ok()) {
    return st;
  }
  if (absl::Status st = fs_.Sync(tmp_fd, tmp); !st.ok()) return st;
  if (absl::Status st = Publish(TmpDirName(step), StepDirName(step)); !st.ok()) return st;
  return fs_.Sync(dir_.get(), opt_.dir);
}

absl::Status CheckpointManagerImpl::WaitForCommit(int64_t step, int tmp_fd, const std::string& tmp,
                                                  const ShardRecord& mine) {
  const std::string final_name = StepDirName(step);
  const std::string final_dir = PathOf(final_name);
  const auto committed = [&]() {
    absl::StatusOr<StepDir> sd = LoadStep(fs_, dir_.get(), final_name, final_dir);
    if (!sd.ok() || opt_.rank >= sd->m.world_size) return false;
    const ShardRecord& r = sd->m.shards[opt_.rank];
    return r.header_xxh3 == mine.header_xxh3 && r.bytes == mine.bytes;
  };
  Poller poll(opt_.shard_timeout, kPollMax);
  while (true) {
    if (committed()) return absl::OkStatus();
    if (Exists(fs_, tmp_fd, kAborted)) {
      return absl::AbortedError(absl::StrCat("rank 0 gave up the save (", tmp, "/", kAborted, ")"));
    }
    if (!Exists(fs_, dir_.get(), TmpDirName(step))) {
      // Renamed away: either our commit (checked above, once more here) or
      // removed by rank 0.
      if (committed()) return absl::OkStatus();
      return absl::AbortedError(absl::StrCat(tmp, " disappeared without a commit by rank 0"));
    }
    if (poll.Expired()) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank 0 did not commit within ", absl::FormatDuration(opt_.shard_timeout),
                       " (waiting for ", final_dir, "/", kManifest, ")"));
    }
    poll.Wait();
  }
}

// Counts valid checkpoints only (those List returns): an invalid one (a
// corrupt manifest, a shard of the wrong size or header) neither takes a
// place of keep_last nor is deleted here (Restore reports it), so the newest
// valid checkpoint always stays.
void CheckpointManagerImpl::ApplyRetention(int64_t saved_step) {
  absl::StatusOr<std::vector<StepName>> dirs = StepDirs(fs_, dir_.get(), opt_.dir);
  if (!dirs.ok()) return;
  int kept_newest = 0;
  for (const StepName& d : *dirs) {  // newest first
    bool keep = d.step == saved_step;
    bool known = keep;
    if (!known) {
      absl::MutexLock l(&mu_);
      known = known_valid_.count(d.step) != 0;
    }
    if (!known) {
      absl::StatusOr<StepDir> sd = LoadStep(fs_, dir_.get(), d.name, d.path);
      if (!sd.ok() || !CheckStep(fs_, *sd).ok()) continue;  // not valid: not counted, kept
    }
    {
      absl::MutexLock l(&mu_);
      known_valid_.insert(d.step);
    }
    if (kept_newest < opt_.keep_last) {
      keep = true;
      ++kept_newest;
    }
    if (opt_.keep_every > 0 && d.step % opt_.keep_every == 0) keep = true;
    if (keep) continue;
    {
      absl::MutexLock l(&mu_);
      known_valid_.erase(d.step);
    }
    DeleteLater(d.name);
  }
}

// Renamed first (cheap, atomic), so that a crash midway never leaves a
// half-deleted checkpoint, then deleted on the background thread.
void CheckpointManagerImpl::DeleteLater(const std::string& name) {
  const std::string trash =
      absl::StrCat(kTrashPrefix, name, "-", ::getpid(), "-", HexDigest(RandomId()));
  if (!fs_.Rename(dir_.get(), name, dir_.get(), trash, false,
                  absl::StrCat(PathOf(name), " -> ", trash))
           .ok()) {
    return;  // retried by a later save
  }
  absl::MutexLock l(&mu_);
  trash_.push_back(trash);
  StartWorker();
}

void CheckpointManagerImpl::RemoveAbortedTmpDirs(int64_t except_step) {
  absl::StatusOr<std::vector<DirEntry>> names = fs_.List(dir_.get(), opt_.dir);
  if (!names.ok()) return;
  for (const DirEntry& e : *names) {
    if (e.name.rfind(kTmpPrefix, 0) != 0 || e.name == TmpDirName(except_step) ||
        e.type != FileType::kDirectory) {
      continue;
    }
    absl::StatusOr<Fd> fd = fs_.OpenDir(dir_.get(), e.name, PathOf(e.name));
    if (fd.ok() && Exists(fs_, fd->get(), kAborted)) {
      RemoveTree(fs_, dir_.get(), e.name, PathOf(e.name));
    }
  }
}

void CheckpointManagerImpl::WaitIdle() {
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(this, &CheckpointManagerImpl::Idle));
}

absl::StatusOr<SaveStats> CheckpointManagerImpl::Save(int64_t step, const StateRegistry& state,
                                                      const Metadata& metadata) {
  if (absl::Status st = CheckWritable(); !st.ok()) return st;
  if (absl::Status st = CheckStepNumber(step); !st.ok()) return st;
  WaitIdle();
  return Write(
      step, metadata, [&state](ckpt::ShardWriter& w) { return state.SaveAll(w); }, nullptr);
}

absl::StatusOr<SaveStats> CheckpointManagerImpl::SaveAsync(int64_t step, const StateRegistry& state,
                                                           const Metadata& metadata) {
  if (absl::Status st = CheckWritable(); !st.ok()) return st;
  if (absl::Status st = CheckStepNumber(step); !st.ok()) return st;
  std::vector<ckpt::HostBlock> pool;
  {
    absl::MutexLock l(&mu_);
    if (pending_ && !opt_.wait_for_pending) {
      SaveStats skipped;
      skipped.skipped = true;
      return skipped;
    }
    mu_.Await(absl::Condition(this, &CheckpointManagerImpl::Idle));
    if (!latched_.ok()) return std::exchange(latched_, absl::OkStatus());
    pool = std::move(spare_);
    spare_.clear();
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto snap = std::make_unique<Snapshot>();
  snap->step = step;
  snap->metadata = metadata;
  snap->state = ckpt::StateSnapshot(std::move(pool));
  if (absl::Status st =
          Guard("saving", [&] { return snap->state.Capture(state, opt_.max_snapshot_bytes); });
      !st.ok()) {
    if (!snap->state.over_limit()) return st;
    snap.reset();  // too large to hold: write it now, from the caller's memory
    return Save(step, state, metadata);
  }
  SaveStats stats;
  stats.snapshot_s = Seconds(t0);
  stats.background = true;
  stats.bytes = static_cast<int64_t>(snap->state.bytes());  // the data; the header when written
  absl::MutexLock l(&mu_);
  StartWorker();
  job_ = std::move(snap);
  pending_ = true;
  return stats;
}

void CheckpointManagerImpl::WorkerLoop() {
  while (true) {
    std::unique_ptr<Snapshot> job;
    std::string trash;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(this, &CheckpointManagerImpl::HasWork));
      if (job_ != nullptr) {
        job = std::move(job_);
      } else if (!trash_.empty()) {
        trash = std::move(trash_.back());
        trash_.pop_back();
      } else {
        return;  // stopping, nothing left to do
      }
    }
    if (!trash.empty()) {
      RemoveTree(fs_, dir_.get(), trash, PathOf(trash));
      continue;
    }
    std::vector<TensorEntry> plan;
    uint64_t off = 0;
    for (const ckpt::StateItem& it : job->state.items()) {
      TensorEntry e;
      e.key = it.key;
      e.dtype = it.dtype;
      e.shape = it.shape;
      e.begin = off;
      off += it.nbytes;
      e.end = off;
      plan.push_back(std::move(e));
    }
    const Snapshot& snap = *job;
    absl::StatusOr<SaveStats> r = Write(
        snap.step, snap.metadata,
        [&snap](ckpt::ShardWriter& w) {
          for (const ckpt::StateItem& it : snap.state.items()) {
            if (absl::Status st = w.PutTensor(it.key, it.dtype, it.shape, it.data, it.nbytes);
                !st.ok()) {
              return st;
            }
          }
          return absl::OkStatus();
        },
        &plan);
    absl::MutexLock l(&mu_);
    if (opt_.keep_snapshot_memory) spare_ = job->state.TakeBlocks();
    job.reset();  // free the host copy (unless kept) before reporting
    if (!r.ok() && latched_.ok()) latched_ = r.status();
    pending_ = false;
  }
}

absl::Status CheckpointManagerImpl::WaitForPending(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  const bool idle =
      mu_.AwaitWithTimeout(absl::Condition(this, &CheckpointManagerImpl::Idle), timeout);
  if (!idle) {
    return absl::DeadlineExceededError(absl::StrCat("an asynchronous checkpoint save in ", opt_.dir,
                                                    " is still being written after ",
                                                    absl::FormatDuration(timeout)));
  }
  return std::exchange(latched_, absl::OkStatus());
}

absl::StatusOr<std::vector<CheckpointInfo>> CheckpointManagerImpl::List() const {
  absl::StatusOr<std::vector<StepName>> dirs = StepDirs(fs_, dir_.get(), opt_.dir);
  if (!dirs.ok()) return dirs.status();
  std::vector<CheckpointInfo> out;
  for (CheckpointStatus& c : ScanAt(fs_, dir_.get(), *dirs)) {
    if (c.status.ok()) out.push_back(std::move(c.info));
  }
  return out;
}

absl::StatusOr<CheckpointManager::RestoreResult> CheckpointManagerImpl::Restore(
    const StateRegistry& state, std::optional<int64_t> step) {
  WaitIdle();
  std::vector<StepName> candidates;
  if (step) {
    if (absl::Status st = CheckStepNumber(*step); !st.ok()) return st;
    const std::string name = StepDirName(*step);
    if (!Exists(fs_, dir_.get(), name)) {
      return absl::NotFoundError(absl::StrCat("no checkpoint of step ", *step, " in ", opt_.dir));
    }
    candidates.push_back({*step, name, PathOf(name)});
  } else {
    absl::StatusOr<std::vector<StepName>> dirs = StepDirs(fs_, dir_.get(), opt_.dir);
    if (!dirs.ok()) return dirs.status();
    candidates = *std::move(dirs);
  }
  // One pass over each shard: its size and header are checked against the
  // manifest first (cheap), then the objects load straight from the file,
  // every tensor checked where it lands. When a checksum fails midway, the
  // objects hold a mix: the next older checkpoint is then loaded entirely
  // (every object's Load again), and only a complete load counts.
  RestoreResult result;
  std::string partial;  // the checkpoint the objects last read from, without success
  const auto partial_note = [&partial]() { return ckpt::PartialLoadNote(partial); };
  for (const StepName& cand : candidates) {
    const std::string& path = cand.path;
    absl::StatusOr<StepDir> m = LoadStep(fs_, dir_.get(), cand.name, path);
    absl::Status st = m.status();
    if (absl::IsFailedPrecondition(st)) {  // newer format: never skipped silently
      return absl::Status(st.code(), absl::StrCat(st.message(), partial_note()));
    }
    if (st.ok()) {
      if (!opt_.job_id.empty() && !m->m.job_id.empty() && m->m.job_id != opt_.job_id) {
        return absl::FailedPreconditionError(
            absl::StrCat(path, " belongs to job '", m->m.job_id, "', this job is '", opt_.job_id,
                         "'; refusing to restore another job's checkpoint", partial_note()));
      }
      if (opt_.rank >= m->m.world_size) {
        return absl::FailedPreconditionError(absl::StrCat(
            path, " was written by ", m->m.world_size, " rank(s) and has no shard for rank ",
            opt_.rank, " (world size now ", opt_.world_size, ")", partial_note()));
      }
      st = CheckShardFiles(fs_, *m);
    }
    absl::StatusOr<Fd> fd = st.ok() ? OpenCheckedShard(fs_, *m, opt_.rank) : st;
    if (!fd.ok()) {
      if (step) return fd.status();
      result.skipped.push_back(std::string(fd.status().message()));
      continue;
    }
    const std::unique_ptr<ckpt::ShardReader> reader =
        ckpt::ShardReader::Open(m->m.ShardPath(opt_.rank), *std::move(fd),
                                m->m.shards[opt_.rank].header_bytes, m->m.entries[opt_.rank]);
    const absl::Status loaded = Guard("loading", [&] { return state.LoadAll(*reader); });
    if (reader->any_read()) partial = path;
    // A failed read or checksum, even one a Stateful ignored or turned into
    // another error, discards the whole load; then every entry no Load read
    // is checked too, so that a restored checkpoint had every checksum right.
    absl::Status bad = reader->read_error();
    if (bad.ok() && loaded.ok()) bad = reader->VerifyUnread();
    if (!bad.ok()) {
      if (step) return absl::Status(bad.code(), absl::StrCat(bad.message(), partial_note()));
      result.skipped.push_back(std::string(bad.message()));
      continue;
    }
    if (!loaded.ok()) {
      return absl::Status(loaded.code(),
                          absl::StrCat("restore ", path, ": ", loaded.message(), partial_note()));
    }
    result.info = m->m.Info();
    return result;
  }
  return ckpt::NoValidCheckpoint(opt_.dir, result.skipped, partial, candidates.size(),
                                 opt_.start_fresh, "CheckpointOptions::start_fresh");
}

absl::Status ValidateOptions(const CheckpointOptions& o) {
  if (o.dir.empty()) return absl::InvalidArgumentError("checkpoint directory is empty");
  if (o.world_size < 1 || o.world_size > 99999) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size ", o.world_size, " is not in [1, 99999]"));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", o.rank, " is not in [0, world_size ", o.world_size, ")"));
  }
  if (o.keep_last < 1) {
    return absl::InvalidArgumentError(absl::StrCat("keep_last ", o.keep_last, " is below 1"));
  }
  if (o.keep_every < 0) {
    return absl::InvalidArgumentError(absl::StrCat("keep_every ", o.keep_every, " is negative"));
  }
  if (o.shard_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("shard_timeout must be positive");
  }
  return absl::OkStatus();
}

// A write past RLIMIT_FSIZE raises SIGXFSZ, whose default action kills the
// process without a word (and with the previous checkpoint's successor half
// written). Ignored, the write fails with EFBIG instead, an I/O error the
// save reports and cleans up after. A handler the program installed stays.
void IgnoreSigxfsz() {
  struct sigaction old = {};
  if (::sigaction(SIGXFSZ, nullptr, &old) == 0 && (old.sa_flags & SA_SIGINFO) == 0 &&
      old.sa_handler == SIG_DFL) {
    struct sigaction ign = {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    ::sigaction(SIGXFSZ, &ign, nullptr);
  }
}

// Read-only: the directory opened, nothing else (no lock, no clean-up).
absl::StatusOr<std::unique_ptr<CheckpointManager>> OpenReadOnly(
    const CheckpointOptions& options, FileSystem& fs, const ckpt::DirectIoOptions& direct) {
  absl::StatusOr<Fd> dir = fs.OpenDir(AT_FDCWD, options.dir, options.dir);
  if (!dir.ok()) {
    return absl::Status(dir.status().code(),
                        absl::StrCat("checkpoint directory ", options.dir,
                                     " (read-only): ", dir.status().message()));
  }
  return std::make_unique<CheckpointManagerImpl>(options, fs, *std::move(dir), Fd(), timespec{},
                                                 direct);
}

absl::StatusOr<std::unique_ptr<CheckpointManager>> OpenOn(const CheckpointOptions& options,
                                                          FileSystem& fs,
                                                          const ckpt::DirectIoOptions& direct) {
  if (absl::Status st = ValidateOptions(options); !st.ok()) return st;
  if (options.read_only) return OpenReadOnly(options, fs, direct);
  IgnoreSigxfsz();
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) {
    return ErrnoStatus(ec.value(), absl::StrCat("create checkpoint directory ", options.dir));
  }
  absl::StatusOr<Fd> dir = fs.OpenDir(AT_FDCWD, options.dir, options.dir);
  if (!dir.ok()) {
    if (absl::IsNotFound(dir.status()) || absl::IsInternal(dir.status())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint directory ", options.dir, " is not a directory: ", dir.status().message()));
    }
    return dir.status();
  }
  const std::string lock_name = LockName(options.rank);
  const std::string lock_path = Join(options.dir, lock_name);
  // Never follows a symbolic link, never opens a FIFO or device (the pid is
  // written into it).
  absl::StatusOr<Fd> opened =
      fs.OpenWrite(dir->get(), lock_name, /*truncate=*/false, /*exclusive=*/false, lock_path);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(), absl::StrCat("checkpoint directory ", options.dir,
                                                             ": cannot create the writer lock: ",
                                                             opened.status().message()));
  }
  Fd lock = *std::move(opened);
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) {
      return ErrnoStatus(errno, absl::StrCat("lock ", lock_path));
    }
    std::string holder;
    char buf[64] = {};
    if (::pread(lock.get(), buf, sizeof(buf) - 1, 0) > 0) {
      holder = absl::StrCat(" (", std::string(buf).substr(0, std::string(buf).find('\n')), ")");
    }
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint directory ", options.dir, " is in use: another live writer",
                     holder, " holds the lock for rank ", options.rank, " (", lock_path, ")"));
  }
  // Who holds it (for the error above) and when (rank 0 ignores fragments
  // older than this). Best effort: a full disk must not prevent a restore.
  const std::string who = absl::StrCat("pid ", ::getpid(), "\n");
  if (::ftruncate(lock.get(), 0) == 0) {
    [[maybe_unused]] const ssize_t n = ::pwrite(lock.get(), who.data(), who.size(), 0);
  }
  ::futimens(lock.get(), nullptr);
  struct stat st;
  if (::fstat(lock.get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", lock_path));
  auto mgr = std::make_unique<CheckpointManagerImpl>(options, fs, *std::move(dir), std::move(lock),
                                                     st.st_mtim, direct);
  if (absl::Status cleaned = mgr->CleanUp(); !cleaned.ok()) return cleaned;
  mgr->LearnHeaderReserve();
  return mgr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointManager>> CheckpointManager::Open(
    const CheckpointOptions& options) {
  return OpenOn(options, internal::RealFileSystem(), ckpt::DirectIoOptions());
}

namespace internal {
absl::StatusOr<std::unique_ptr<CheckpointManager>> OpenCheckpointManagerOn(
    const CheckpointOptions& options, FileSystem& fs, const ckpt::DirectIoOptions& direct) {
  return OpenOn(options, fs, direct);
}
}  // namespace internal

}  // namespace omni
