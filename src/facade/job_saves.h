// The Runtime's job-level checkpoints in elastic mode (private): one
// checkpoint directory shared by the replicas (omni/job_checkpoint.h), the
// agreement that precedes a save, and the two-phase restore (replicated
// state before joining the group, per-replica state after, once the rank is
// known).
//
// Thread safety: used by the Runtime's training thread only.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "omni/elastic.h"
#include "omni/job_checkpoint.h"
#include "omni/state.h"

namespace omni::internal {

class JobSaves {
 public:
  using Log = std::function<void(const std::string&)>;
  // Opens `options.dir` (the job's shared lock; see JobCheckpointManager).
  static absl::StatusOr<std::unique_ptr<JobSaves>> Open(const JobCheckpointOptions& options,
                                                        Log log);

  // Before joining: loads the replicated state of the newest valid
  // checkpoint; nullopt when there is none (errors as RestoreReplicated).
  absl::StatusOr<std::optional<int64_t>> RestoreReplicated(const StateRegistry& replicated);
  // After joining, at `step` (the group's): this replica's per-replica state
  // from the part written by the replica with its id, else by its rank when
  // that part's writer is not a member now. OK (and a log line) when the
  // checkpoint of `step` has no part for it: it keeps its initial state.
  absl::Status RestorePerReplica(const StateRegistry& per_replica, int64_t step,
                                 const Generation& generation, const std::string& self_id);

  // After a change of generation, with every replica of the new one: when
  // all use this directory and its newest valid checkpoint is newer than
  // `step` (the group's state: every replica that held the newer one is
  // gone and none was restarted, which would have brought it), each loads
  // that checkpoint, its replicated state and then its per-replica state
  // (as RestorePerReplica), and the checkpoint's step is returned; nullopt
  // otherwise. One collective (the newest step and the directory's
  // identity); its failure is Aborted and nothing was loaded. A load that
  // fails leaves the state partly replaced: the error is returned and the
  // replica must not go on (its restart restores a valid checkpoint).
  absl::StatusOr<std::optional<int64_t>> CatchUp(int64_t step, ElasticGroup& group,
                                                 const StateRegistry& replicated,
                                                 const StateRegistry& per_replica,
                                                 const std::string& self_id);

  // A save with every replica of the group's generation, at the same
  // boundary. One collective first agrees on a token and checks that all
  // replicas use this directory (same device and inode); when they do not
  // (one directory per replica), each saves alone into its own. A failure of
  // that collective (a peer died) is Aborted: nothing was written.
  absl::StatusOr<JobSaveStats> SaveTogether(int64_t step, ElasticGroup& group,
                                            const StateRegistry& replicated,
                                            const StateRegistry& per_replica,
                                            const std::map<std::string, std::string>& metadata);
  absl::StatusOr<JobSaveStats> SaveAlone(int64_t step, const StateRegistry& replicated,
                                         const StateRegistry& per_replica,
                                         const std::map<std::string, std::string>& metadata) {
    return mgr_->SaveAlone(step, replicated, per_replica, metadata);
  }

  JobCheckpointManager& manager() { return *mgr_; }

 private:
  JobSaves(std::unique_ptr<JobCheckpointManager> mgr, Log log, dev_t dev, ino_t ino)
      : mgr_(std::move(mgr)),
        log_(std::move(log)),
        dev_(static_cast<int64_t>(dev & 0x3fffffffffffffffull)),
        ino_(static_cast<int64_t>(ino & 0x3fffffffffffffffull)) {}
  // After a min or max reduction of {dev_, ino_, -dev_, -ino_, ...} over
  // the replicas: whether all of them use this directory (each pair still
  // opposite).
  static bool SameDirectory(const std::vector<int64_t>& reduced) {
    return reduced[0] == -reduced[2] && reduced[1] == -reduced[3];
  }
  std::unique_ptr<JobCheckpointManager> mgr_;
  Log log_;
  // The directory's device and inode, as non-negative int64s for a
  // collective.
  const int64_t dev_, ino_;
  bool told_separate_ = false;
};

}  // namespace omni::internal
