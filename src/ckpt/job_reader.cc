#include "ckpt/job_reader.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ckpt/ckpt_util.h"
#include "omni/hash.h"

namespace omni::ckpt {
namespace {

using internal::ErrnoStatus;
using internal::FileSystem;

constexpr const char* kManifest = kJobManifest;
constexpr size_t kMaxManifestBytes = kJobMaxManifestBytes;
constexpr const char* kLock = ".lock-job";
constexpr const char* kLockGuard = ".lock-job-guard";

}  // namespace

absl::StatusOr<StepDir> LoadStep(FileSystem& fs, int dir, const std::string& name,
                                 const std::string& path) {
  return LoadStepDir<StepDir>(fs, dir, name, path, ParseJobManifest);
}

absl::StatusOr<StepDir> LoadStepPath(const std::string& path) {
  const std::string p = TrimTrailingSlashes(path);
  return LoadStep(internal::RealFileSystem(), AT_FDCWD, p, p);
}

// Opens part `rank` and checks its size and header against the manifest.
absl::StatusOr<Fd> OpenCheckedPart(FileSystem& fs, const StepDir& sd, int rank,
                                   std::vector<TensorEntry>* entries_out) {
  const JobPart& part = sd.m.parts[rank];
  std::vector<TensorEntry> want = sd.m.PartEntries(rank);
  absl::StatusOr<Fd> fd =
      OpenShardAsRecorded(fs, sd.fd.get(), part.file, Join(sd.m.dir, part.file),
                          RecordedShard{part.bytes, part.header_bytes, part.header_xxh3, &want});
  if (!fd.ok()) return fd.status();
  if (entries_out != nullptr) *entries_out = std::move(want);
  return fd;
}

absl::Status CheckStep(FileSystem& fs, const StepDir& sd) {
  for (int r = 0; r < sd.m.world_size; ++r) {
    absl::StatusOr<Fd> fd = OpenCheckedPart(fs, sd, r);
    if (!fd.ok()) return fd.status();
  }
  return absl::OkStatus();
}

std::vector<CheckpointStatus> ScanAt(FileSystem& fs, int dir, const std::vector<StepName>& dirs) {
  return ScanSteps(
      dirs, [&](const StepName& d) { return LoadStep(fs, dir, d.name, d.path); },
      [&](const StepDir& sd) { return CheckStep(fs, sd); });
}

std::vector<JobPartInfo> PartsOf(const JobManifest& m) {
  std::vector<JobPartInfo> out;
  for (const JobPart& p : m.parts) {
    out.push_back({p.rank, p.replica_id, Join(m.dir, p.file), static_cast<int64_t>(p.bytes),
                   static_cast<int64_t>(p.replicated_bytes),
                   static_cast<int64_t>(p.replica_bytes)});
  }
  return out;
}

// Joins the job's shared lock on `dir` (see the header).
absl::StatusOr<Fd> JoinJobLock(FileSystem& fs, int dir, const std::string& dir_path,
                               const std::string& job_id,
                               const std::function<void()>& while_first) {
  const std::string guard_path = Join(dir_path, kLockGuard);
  absl::StatusOr<Fd> guard = fs.OpenWrite(dir, kLockGuard, false, false, guard_path);
  if (!guard.ok()) {
    return absl::Status(guard.status().code(),
                        absl::StrCat("checkpoint directory ", dir_path,
                                     ": cannot create the job lock: ", guard.status().message()));
  }
  // The guard is held only for the few calls below, by any replica.
  internal::Poller poll(absl::Seconds(30), absl::Milliseconds(20));
  while (::flock(guard->get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return ErrnoStatus(errno, absl::StrCat("lock ", guard_path));
    if (poll.Expired()) {
      return absl::DeadlineExceededError(absl::StrCat("lock ", guard_path, " held for 30 s"));
    }
    poll.Wait();
  }
  const std::string lock_path = Join(dir_path, kLock);
  absl::StatusOr<Fd> opened = fs.OpenWrite(dir, kLock, false, false, lock_path);
  if (!opened.ok()) return opened.status();
  Fd lock = *std::move(opened);
  const std::string mine = absl::StrCat("job ", job_id, "\n");
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) == 0) {
    if (::ftruncate(lock.get(), 0) != 0 ||
        ::pwrite(lock.get(), mine.data(), mine.size(), 0) != static_cast<ssize_t>(mine.size())) {
      return ErrnoStatus(errno, absl::StrCat("write ", lock_path));
    }
    if (::flock(lock.get(), LOCK_SH) != 0)
      return ErrnoStatus(errno, absl::StrCat("lock ", lock_path));
    // Still under the guard: a replica that joins now waits for it.
    if (while_first) while_first();
    return lock;
  }
  if (errno != EWOULDBLOCK) return ErrnoStatus(errno, absl::StrCat("lock ", lock_path));
  std::string held(4096, '\0');
  const ssize_t n = ::pread(lock.get(), held.data(), held.size(), 0);
  held.resize(n > 0 ? static_cast<size_t>(n) : 0);
  if (held != mine) {
    std::string other = held.rfind("job ", 0) == 0 ? held.substr(4) : held;
    while (!other.empty() && other.back() == '\n') other.pop_back();
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint directory ", dir_path, " is in use by another job: live replicas of job '",
        other, "' hold ", lock_path, " (this job is '", job_id, "')"));
  }
  if (::flock(lock.get(), LOCK_SH | LOCK_NB) != 0) {
    return ErrnoStatus(errno, absl::StrCat("lock ", lock_path, " (shared)"));
  }
  return lock;
}

}  // namespace omni::ckpt

namespace omni {

using ckpt::Fd;
using ckpt::JobManifest;
using ckpt::JobPart;
using ckpt::JobPiece;
using ckpt::JobTensor;
using ckpt::Join;
using ckpt::LoadStepPath;
using ckpt::StepDir;
using ckpt::StepName;
using ckpt::TensorEntry;
using internal::FileSystem;
constexpr const char* kManifest = ckpt::kJobManifest;

bool IsJobCheckpoint(const std::string& step_dir) {
  absl::StatusOr<std::string> text =
      internal::ReadFileAt(internal::RealFileSystem(), AT_FDCWD, Join(step_dir, kManifest),
                           Join(step_dir, kManifest), ckpt::kJobMaxManifestBytes);
  return text.ok() && ckpt::DeclaresJobLayout(*text);
}

absl::StatusOr<std::vector<CheckpointStatus>> ScanJobCheckpoints(const std::string& dir) {
  FileSystem& fs = internal::RealFileSystem();
  absl::StatusOr<Fd> fd = fs.OpenDir(AT_FDCWD, dir, dir);
  if (!fd.ok()) return fd.status();
  absl::StatusOr<std::vector<StepName>> dirs = ckpt::StepDirs(fs, fd->get(), dir);
  if (!dirs.ok()) return dirs.status();
  std::vector<StepName> job;
  for (const StepName& d : *dirs) {
    if (IsJobCheckpoint(d.path)) job.push_back(d);
  }
  return ckpt::ScanAt(fs, fd->get(), job);
}

absl::Status VerifyJobCheckpoint(const std::string& path) {
  absl::StatusOr<StepDir> sd = LoadStepPath(path);
  if (!sd.ok()) return sd.status();
  FileSystem& fs = internal::RealFileSystem();
  for (int r = 0; r < sd->m.world_size; ++r) {
    std::vector<TensorEntry> entries;
    absl::StatusOr<Fd> fd = ckpt::OpenCheckedPart(fs, *sd, r, &entries);
    if (!fd.ok()) return fd.status();
    if (auto st = ckpt::VerifyShardData(fd->get(), Join(sd->m.dir, sd->m.parts[r].file),
                                        sd->m.parts[r].header_bytes, entries);
        !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<JobPartInfo>> JobCheckpointParts(const std::string& path) {
  absl::StatusOr<StepDir> sd = LoadStepPath(path);
  if (!sd.ok()) return sd.status();
  return ckpt::PartsOf(sd->m);
}

absl::StatusOr<std::string> DescribeJobCheckpoint(const std::string& path) {
  absl::StatusOr<StepDir> sd = LoadStepPath(path);
  if (!sd.ok()) return sd.status();
  const JobManifest& m = sd->m;
  std::string out = absl::StrCat("checkpoint ", m.dir, " (job-level)\n");
  char created[64] = "?";
  const auto secs = static_cast<std::time_t>(m.created_unix_ms / 1000);
  std::tm tm{};
  if (gmtime_r(&secs, &tm) != nullptr)
    std::strftime(created, sizeof(created), "%Y-%m-%dT%H:%M:%SZ", &tm);
  absl::StrAppend(&out, "  format      omni.checkpoint v", m.version,
                  " layout job, written by omni ", m.library_version, "\n");
  absl::StrAppend(&out, "  step        ", m.step, "\n");
  absl::StrAppend(&out, "  job         ", m.job_id, "\n");
  absl::StrAppend(&out, "  created     ", created, "\n");
  absl::StrAppend(&out, "  replicas    ", m.world_size, "\n");
  absl::StrAppend(&out, "  bytes       ", m.TotalBytes(), "\n");
  absl::StrAppend(&out, "  token       ", HexDigest(m.token), "\n");
  absl::StrAppend(&out, "  metadata", m.metadata.empty() ? "    (none)" : "", "\n");
  for (const auto& [k, v] : m.metadata) absl::StrAppend(&out, "    ", k, " = ", v, "\n");
  absl::StrAppend(&out, "  parts (rank, replica, file, bytes, replicated share, per-replica)\n");
  for (const JobPart& p : m.parts) {
    absl::StrAppend(&out, "    rank ", p.rank, "  ", p.replica_id.empty() ? "-" : p.replica_id,
                    "  ", p.file, "  ", p.bytes, " bytes  replicated ", p.replicated_bytes,
                    "  per-replica ", p.replica_bytes, "  xxh3 ", HexDigest(p.xxh3), "\n");
  }
  absl::StrAppend(&out, "  replicated (", m.replicated.size(), ")\n");
  for (const JobTensor& t : m.replicated) {
    absl::StrAppend(&out, "    ", t.key, "  ", DTypeName(t.dtype), " ", ckpt::ShapeString(t.shape),
                    "  ", t.nbytes, " bytes in");
    for (const JobPiece& p : t.pieces) {
      absl::StrAppend(&out, " part ", p.part, " [", p.begin, ",", p.end, ") xxh3 ",
                      HexDigest(p.xxh3), ";");
    }
    out += "\n";
  }
  for (size_t r = 0; r < m.per_replica.size(); ++r) {
    absl::StrAppend(&out, "  per replica, part ", r, " (", m.per_replica[r].size(), ")\n");
    for (const TensorEntry& e : m.per_replica[r]) {
      absl::StrAppend(&out, "    ", e.key, "  ", DTypeName(e.dtype), " ",
                      ckpt::ShapeString(e.shape), "  ", e.end - e.begin, " bytes  xxh3 ",
                      HexDigest(e.xxh3), "\n");
    }
  }
  return out;
}

}  // namespace omni
