// Reading per-rank checkpoints (private): a step directory and its
// manifest, the checks of its shards, and listing. Used by the manager
// (ckpt/checkpoint.cc) and the tools' functions of omni/checkpoint.h
// (ScanCheckpoints, ListCheckpoints, VerifyCheckpoint, DescribeCheckpoint,
// defined in rank_reader.cc); the job-level counterpart is ckpt/job_reader.h.
// Nothing inside a step directory is reached through a symbolic link.
//
// Thread safety: plain functions.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/rank_manifest.h"
#include "ckpt/safetensors.h"
#include "ckpt/step_dirs.h"
#include "common/fs.h"
#include "omni/checkpoint.h"

namespace omni::ckpt::rank {

// A step directory opened for reading: `fd` (no symbolic link followed)
// and its manifest.
struct StepDir {
  Fd fd;
  Manifest m;
};

// Opens `name` under `dir` (the step directory `path`) and reads its
// manifest. NotFound when the directory has no manifest (not a checkpoint);
// FailedPrecondition for a symbolic link, a FIFO or another special file.
absl::StatusOr<StepDir> LoadStep(internal::FileSystem& fs, int dir, const std::string& name,
                                 const std::string& path);
// A step directory named by the user (may be reached through symbolic links:
// the user named it; nothing inside it is followed).
absl::StatusOr<StepDir> LoadStepPath(const std::string& path);

// Cheap checks of every shard: a regular file of the recorded size.
absl::Status CheckShardFiles(internal::FileSystem& fs, const StepDir& sd);
// Opens one shard and checks what is cheap to check: its size, and its
// header against the manifest (every key, dtype, shape and offset).
absl::StatusOr<Fd> OpenCheckedShard(internal::FileSystem& fs, const StepDir& sd, int rank);
// The checks of List (and ScanCheckpoints): the manifest, every shard of
// its size, and every shard's header against the manifest (a few reads of
// each shard's first bytes; no checksum of the data).
absl::Status CheckStep(internal::FileSystem& fs, const StepDir& sd);
// Full verification of one shard: size, header against the manifest, every
// checksum.
absl::Status VerifyShard(internal::FileSystem& fs, const StepDir& sd, int rank);

// Every step directory of `dirs` under `dir`, loaded and checked (CheckStep).
std::vector<CheckpointStatus> ScanAt(internal::FileSystem& fs, int dir,
                                     const std::vector<StepName>& dirs);
// The same for the checkpoint directory `dir`.
absl::StatusOr<std::vector<CheckpointStatus>> Scan(const std::string& dir);

}  // namespace omni::ckpt::rank
