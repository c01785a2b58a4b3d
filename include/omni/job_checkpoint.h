// Job-level checkpoints: one checkpoint directory shared by every replica of
// an elastic data-parallel job (omni::Runtime uses this in elastic mode).
//
//   <dir>/step-000000001200/manifest.json            one manifest, the whole job
//   <dir>/step-000000001200/part-00000.safetensors   one part per replica
//   <dir>/step-000000001200/part-00001.safetensors
//   <dir>/.lock-job  .lock-job-guard                 the job's shared lock
//
// Replicated state (identical on every replica: parameters, optimizer
// moments, LR schedule, data cursor, step) is written once per checkpoint,
// its bytes spread over the replicas: every replica lists the replicated
// tensors (keys, dtypes, shapes, in registration order — the same on every
// replica), lays them end to end, and writes the slice [k·T/N, (k+1)·T/N)
// of that byte stream (cut at element boundaries), so each writes about
// 1/N of it without any exchange (the deduplication of PyTorch DCP's planner,
// at byte rather than tensor granularity, so one large tensor does not
// unbalance it). A tensor cut between replicas is stored in each part as a
// 1-D piece of its dtype. Per-replica state (RNGs) is written whole into
// the replica's own part.
//
// manifest.json (format "omni.checkpoint", version 2, layout "job"):
//
//   {"format":"omni.checkpoint","version":2,"layout":"job","step":1200,
//    "world_size":2,"library_version":"0.1.0","job_id":"...",
//    "created_unix_ms":...,"token":"16hex","metadata":{"k":"v"},
//    "parts":[{"rank":0,"replica_id":"r0","file":"part-00000.safetensors",
//              "bytes":N,"header_bytes":H,"header_xxh3":"16hex","xxh3":"16hex",
//              "replicated_bytes":R,"replica_bytes":P}, ...],
//    "replicated":{"model/w":{"dtype":"F32","shape":[4,4],"pieces":[
//        {"part":0,"range":[0,32],"data_offsets":[0,32],"xxh3":"16hex"},
//        {"part":1,"range":[32,64],"data_offsets":[0,32],"xxh3":"16hex"}]}},
//    "per_replica":[{"rng/cpu":{"dtype":"U8","shape":[5056],
//                               "data_offsets":[32,5088],"xxh3":"16hex"}}, ...]}
//
// `range` is the piece's byte range within the tensor (pieces of a key tile
// it in order); data_offsets are relative to the part's data section, and a
// part's entries (its pieces and per-replica tensors) fill it back to back,
// checksummed as in format version 1 (omni/checkpoint.h).
//
// Commit (Save): every replica writes its part under <dir>/.tmp-step-<step>,
// fsyncs it, then publishes a small description of it (part-<rank>.json,
// written aside, fsynced and renamed in: never read half-written). Rank 0
// waits until the parts of all `size` replicas of this save (same token)
// are there and durable, writes the manifest, fsyncs, and renames the
// directory into place; the others wait until the manifest carrying the
// save's token is in place. A replica that dies mid-save (seen by
// JobSaveGroup::check, or after part_timeout) makes the save fail on every
// replica: no manifest is ever written for it, so the previous checkpoint
// stays the newest valid one and the partial directory is never taken for
// a checkpoint (it is removed by a later commit or the next exclusive Open).
//
// Locking: a process holds <dir>/.lock-job shared (flock, released by the
// kernel when it dies) for the job id written in it; a process of the same
// job id joins the holders, one of another job id is refused
// (FailedPrecondition naming both ids) while any holder lives.
//
// Restore: every replica loads the replicated state from all parts
// (RestoreReplicated; any replica count), then its per-replica state from the
// part written by the replica with its id, or else by its rank
// (RestorePerReplica). Every checksum is checked as the bytes land; a
// checkpoint that fails a check is skipped for the previous one as in
// CheckpointManager::Restore.
//
// Thread safety: a JobCheckpointManager is used by one thread. Managers of
// the replicas of one job (threads of one process, or processes) share the
// directory.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "omni/checkpoint.h"
#include "omni/export.h"
#include "omni/state.h"

namespace omni {

struct JobCheckpointOptions {
  std::string dir;         // shared by the job's replicas (created if missing)
  std::string job_id;      // required: the lock admits only this job's replicas
  std::string replica_id;  // this replica, recorded with its parts
  int keep_last = 3;       // retention as CheckpointOptions (applied by rank 0)
  int64_t keep_every = 0;
  // How long a save waits for the other replicas' parts (rank 0) or for the
  // commit (the others) before failing with DeadlineExceeded.
  absl::Duration part_timeout = absl::Minutes(5);
  // As CheckpointOptions::start_fresh.
  bool start_fresh = false;
};

// The replicas taking part in one save.
struct JobSaveGroup {
  int rank = 0;  // this replica's rank in [0, size)
  int size = 1;
  // The same on every replica of this save and different for every attempt
  // (e.g. the maximum of random numbers, agreed by a collective): parts of
  // an earlier attempt at the same step are never mixed in.
  uint64_t token = 0;
  // Polled while waiting for the others: an error (e.g. "replica r2 died")
  // abandons the save at once. May be empty.
  std::function<absl::Status()> check;
};

struct JobSaveStats {
  int64_t bytes = 0;             // this replica's part file
  int64_t replicated_bytes = 0;  // its share of the replicated state's data
  int64_t replica_bytes = 0;     // its per-replica state's data
  double write_s = 0;            // writing and fsyncing its part
  double commit_s = 0;           // waiting for the others, manifest, rename
  bool solo = false;             // SaveAlone
  bool kept_existing = false;    // SaveAlone found the step already saved
};

// One part of a job-level checkpoint.
struct JobPartInfo {
  int rank = 0;
  std::string replica_id;
  std::string file;  // path
  int64_t bytes = 0;
  int64_t replicated_bytes = 0;
  int64_t replica_bytes = 0;
};

class OMNI_EXPORT JobCheckpointManager {
 public:
  // Creates the directory and joins the job's shared lock (see above):
  // FailedPrecondition naming both job ids when another job holds it;
  // InvalidArgument for an empty dir or job_id. The first holder (no live
  // process holds the lock) removes what crashed saves left (temporary and
  // trash directories) before any other replica can join, so a replica that
  // joins and saves at once keeps its part. Nothing inside `dir` is
  // followed out of it (as CheckpointManager::Open).
  static absl::StatusOr<std::unique_ptr<JobCheckpointManager>> Open(
      const JobCheckpointOptions& options);
  virtual ~JobCheckpointManager() = default;

  // Collective: every replica of `group` calls it for the same step with the
  // same token, `replicated` holding identical state (the same keys, dtypes
  // and shapes on every replica; rank 0 checks this and fails naming the
  // replica that differs). Durable when it returns OK on any replica. On an
  // error, earlier checkpoints are untouched and this attempt's checkpoint is
  // either absent or complete (rank 0 may have committed it just before
  // another replica gave up waiting); never partial. An existing checkpoint
  // of the step is replaced. Aborted when a replica gave the save up, or
  // when the save's temporary directory is gone (the others gave it up and
  // a later save removed it while this replica was held up).
  // Rank 0 applies retention after the commit.
  virtual absl::StatusOr<JobSaveStats> Save(int64_t step, const JobSaveGroup& group,
                                            const StateRegistry& replicated,
                                            const StateRegistry& per_replica,
                                            const std::map<std::string, std::string>& metadata) = 0;
  // A checkpoint of this replica alone (one part holding everything), for a
  // replica that cannot save with the others (the store failed, it leaves
  // the job). When `step` is already saved it is kept (kept_existing): the
  // replicated state is the same.
  virtual absl::StatusOr<JobSaveStats> SaveAlone(
      int64_t step, const StateRegistry& replicated, const StateRegistry& per_replica,
      const std::map<std::string, std::string>& metadata) = 0;

  // Valid job-level checkpoints (cheap checks as CheckpointManager::List),
  // newest first.
  virtual absl::StatusOr<std::vector<CheckpointInfo>> List() const = 0;
  // The parts of checkpoint `step` (NotFound / DataLoss as Restore).
  virtual absl::StatusOr<std::vector<JobPartInfo>> Parts(int64_t step) const = 0;

  // Loads the replicated state of the newest valid checkpoint (or `step`)
  // from all its parts, whatever the replica count it was written with.
  // Errors and fallback as CheckpointManager::Restore.
  virtual absl::StatusOr<CheckpointManager::RestoreResult> RestoreReplicated(
      const StateRegistry& replicated, std::optional<int64_t> step = std::nullopt) = 0;
  // Loads `per_replica` from part `part` of checkpoint `step` (see Parts).
  // NotFound when there is no such checkpoint or part; DataLoss naming the
  // file and key for a checksum mismatch; the objects' own errors.
  virtual absl::Status RestorePerReplica(const StateRegistry& per_replica, int64_t step,
                                         int part) = 0;
};

// For tools. True when `step_dir` holds a job-level manifest (layout "job").
OMNI_EXPORT bool IsJobCheckpoint(const std::string& step_dir);
// Every step directory of `dir` that holds a job-level manifest, newest
// first, with why one is not valid (the cheap checks of List).
OMNI_EXPORT absl::StatusOr<std::vector<CheckpointStatus>> ScanJobCheckpoints(
    const std::string& dir);
// Every check of a job-level checkpoint: the manifest, every part's size and
// header, every checksum. DataLoss naming the file and key at the first
// mismatch.
OMNI_EXPORT absl::Status VerifyJobCheckpoint(const std::string& path);
// The manifest in words: which replica wrote what, sizes, checksums.
OMNI_EXPORT absl::StatusOr<std::string> DescribeJobCheckpoint(const std::string& path);
// The parts of the job-level checkpoint at `path`.
OMNI_EXPORT absl::StatusOr<std::vector<JobPartInfo>> JobCheckpointParts(const std::string& path);

}  // namespace omni
