#include "ckpt/rank_reader.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/strings.h"
#include "omni/hash.h"

namespace omni::ckpt::rank {

using internal::FileStat;
using internal::FileSystem;
using internal::FileType;

absl::StatusOr<StepDir> LoadStep(FileSystem& fs, int dir, const std::string& name,
                                 const std::string& path) {
  return LoadStepDir<StepDir>(fs, dir, name, path, ParseManifest);
}

absl::StatusOr<StepDir> LoadStepPath(const std::string& path) {
  const std::string p = ckpt::TrimTrailingSlashes(path);
  return LoadStep(internal::RealFileSystem(), AT_FDCWD, p, p);
}

absl::Status CheckShardFiles(FileSystem& fs, const StepDir& sd) {
  const Manifest& m = sd.m;
  for (size_t r = 0; r < m.shards.size(); ++r) {
    const std::string path = m.ShardPath(static_cast<int>(r));
    absl::StatusOr<FileStat> st = fs.Stat(sd.fd.get(), m.shards[r].file, path);
    if (!st.ok()) return st.status();
    if (st->type == FileType::kSymlink) {
      return absl::FailedPreconditionError(absl::StrCat(path, " is a symbolic link; not followed"));
    }
    if (st->type != FileType::kRegular) {
      return absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
    }
    if (st->size != m.shards[r].bytes) {
      return absl::DataLossError(absl::StrCat(path, ": ", st->size, " bytes, the manifest says ",
                                              m.shards[r].bytes, " (truncated or replaced?)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Fd> OpenCheckedShard(FileSystem& fs, const StepDir& sd, int rank) {
  const ShardRecord& rec = sd.m.shards[rank];
  return OpenShardAsRecorded(
      fs, sd.fd.get(), rec.file, sd.m.ShardPath(rank),
      RecordedShard{rec.bytes, rec.header_bytes, rec.header_xxh3, &sd.m.entries[rank]});
}

absl::Status CheckStep(FileSystem& fs, const StepDir& sd) {
  if (absl::Status st = CheckShardFiles(fs, sd); !st.ok()) return st;
  for (int r = 0; r < sd.m.world_size; ++r) {
    absl::StatusOr<Fd> fd = OpenCheckedShard(fs, sd, r);
    if (!fd.ok()) return fd.status();
  }
  return absl::OkStatus();
}

absl::Status VerifyShard(FileSystem& fs, const StepDir& sd, int rank) {
  absl::StatusOr<Fd> fd = OpenCheckedShard(fs, sd, rank);
  if (!fd.ok()) return fd.status();
  return ckpt::VerifyShardData(fd->get(), sd.m.ShardPath(rank), sd.m.shards[rank].header_bytes,
                               sd.m.entries[rank]);
}

std::vector<CheckpointStatus> ScanAt(FileSystem& fs, int dir, const std::vector<StepName>& dirs) {
  return ckpt::ScanSteps(
      dirs, [&](const StepName& d) { return LoadStep(fs, dir, d.name, d.path); },
      [&](const StepDir& sd) { return CheckStep(fs, sd); });
}

absl::StatusOr<std::vector<CheckpointStatus>> Scan(const std::string& dir) {
  FileSystem& fs = internal::RealFileSystem();
  absl::StatusOr<Fd> fd = fs.OpenDir(AT_FDCWD, dir, dir);
  if (!fd.ok()) return fd.status();
  absl::StatusOr<std::vector<StepName>> dirs = StepDirs(fs, fd->get(), dir);
  if (!dirs.ok()) return dirs.status();
  return ScanAt(fs, fd->get(), *dirs);
}

}  // namespace omni::ckpt::rank

namespace omni {

using ckpt::TensorEntry;
using ckpt::rank::CheckShardFiles;
using ckpt::rank::kFormat;
using ckpt::rank::LoadStepPath;
using ckpt::rank::Manifest;
using ckpt::rank::Scan;
using ckpt::rank::ShardRecord;
using ckpt::rank::StepDir;
using ckpt::rank::VerifyShard;
using internal::FileSystem;

absl::StatusOr<std::vector<CheckpointStatus>> ScanCheckpoints(const std::string& dir) {
  return Scan(dir);
}

absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& dir) {
  absl::StatusOr<std::vector<CheckpointStatus>> all = Scan(dir);
  if (!all.ok()) return all.status();
  std::vector<CheckpointInfo> out;
  for (CheckpointStatus& c : *all) {
    if (c.status.ok()) out.push_back(std::move(c.info));
  }
  return out;
}

absl::Status VerifyCheckpoint(const std::string& path) {
  absl::StatusOr<StepDir> sd = LoadStepPath(path);
  if (!sd.ok()) return sd.status();
  FileSystem& fs = internal::RealFileSystem();
  if (absl::Status st = CheckShardFiles(fs, *sd); !st.ok()) return st;
  for (int r = 0; r < sd->m.world_size; ++r) {
    if (absl::Status st = VerifyShard(fs, *sd, r); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> DescribeCheckpoint(const std::string& path) {
  absl::StatusOr<StepDir> sd = LoadStepPath(path);
  if (!sd.ok()) return sd.status();
  const Manifest* m = &sd->m;
  std::string out = absl::StrCat("checkpoint ", m->dir, "\n");
  char created[64] = "?";
  const std::time_t secs = static_cast<std::time_t>(m->created_unix_ms / 1000);
  std::tm tm{};
  if (gmtime_r(&secs, &tm) != nullptr)
    std::strftime(created, sizeof(created), "%Y-%m-%dT%H:%M:%SZ", &tm);
  absl::StrAppend(&out, "  format      ", kFormat, " v", m->version, ", written by omni ",
                  m->library_version, "\n");
  absl::StrAppend(&out, "  step        ", m->step, "\n");
  absl::StrAppend(&out, "  job         ", m->job_id.empty() ? "(none)" : m->job_id, "\n");
  absl::StrAppend(&out, "  created     ", created, "\n");
  absl::StrAppend(&out, "  world size  ", m->world_size, "\n");
  absl::StrAppend(&out, "  bytes       ", m->TotalBytes(), "\n");
  absl::StrAppend(&out, "  metadata", m->metadata.empty() ? "    (none)" : "", "\n");
  for (const auto& [k, v] : m->metadata) absl::StrAppend(&out, "    ", k, " = ", v, "\n");
  absl::StrAppend(&out, "  shards\n");
  for (const ShardRecord& r : m->shards) {
    absl::StrAppend(&out, "    rank ", r.rank, "  ", r.file, "  ", r.bytes, " bytes (header ",
                    r.header_bytes, ")  xxh3 ", HexDigest(r.xxh3), "\n");
  }
  size_t n = 0;
  for (const auto& es : m->entries) n += es.size();
  absl::StrAppend(&out, "  entries (", n, ")\n");
  size_t width = 3;
  for (const auto& es : m->entries) {
    for (const TensorEntry& e : es) width = std::max(width, e.key.size());
  }
  char line[128];
  for (size_t s = 0; s < m->entries.size(); ++s) {
    for (const TensorEntry& e : m->entries[s]) {
      std::snprintf(line, sizeof(line), "  %5zu  %-4s  %-20s  %12" PRIu64 "  %s\n", s,
                    DTypeName(e.dtype), ckpt::ShapeString(e.shape).c_str(), e.end - e.begin,
                    HexDigest(e.xxh3).c_str());
      absl::StrAppend(&out, "    ", e.key, std::string(width - e.key.size(), ' '), line);
    }
  }
  return out;
}

}  // namespace omni
