#include "facade/job_saves.h"

#include <sys/random.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fs.h"

namespace omni::internal {

absl::StatusOr<std::unique_ptr<JobSaves>> JobSaves::Open(const JobCheckpointOptions& options,
                                                         Log log) {
  absl::StatusOr<std::unique_ptr<JobCheckpointManager>> mgr = JobCheckpointManager::Open(options);
  if (!mgr.ok()) return mgr.status();
  struct stat st;
  if (::stat(options.dir.c_str(), &st) != 0) {
    return ErrnoStatus(errno, absl::StrCat("stat ", options.dir));
  }
  return std::unique_ptr<JobSaves>(
      new JobSaves(*std::move(mgr), std::move(log), st.st_dev, st.st_ino));
}

absl::StatusOr<std::optional<int64_t>> JobSaves::RestoreReplicated(
    const StateRegistry& replicated) {
  absl::StatusOr<CheckpointManager::RestoreResult> r = mgr_->RestoreReplicated(replicated);
  if (!r.ok()) {
    if (absl::IsNotFound(r.status())) return std::nullopt;
    return r.status();
  }
  for (const std::string& why : r->skipped) log_("skipped checkpoint: " + why);
  log_(absl::StrCat("restored the replicated state of ", r->info.path, " (written by ",
                    r->info.world_size, " replica(s))"));
  return r->info.step;
}

absl::Status JobSaves::RestorePerReplica(const StateRegistry& per_replica, int64_t step,
                                         const Generation& generation, const std::string& self_id) {
  if (per_replica.objects().empty()) return absl::OkStatus();
  absl::StatusOr<std::vector<JobPartInfo>> parts = mgr_->Parts(step);
  if (!parts.ok()) {
    if (absl::IsNotFound(parts.status())) return absl::OkStatus();  // no checkpoint of the step
    return parts.status();
  }
  int part = -1;
  for (const JobPartInfo& p : *parts) {
    if (!self_id.empty() && p.replica_id == self_id) part = p.rank;
  }
  const int rank = generation.rank;
  if (part < 0 && rank >= 0 && rank < static_cast<int>(parts->size())) {
    const std::string& writer = (*parts)[rank].replica_id;
    const bool member = std::any_of(generation.members.begin(), generation.members.end(),
                                    [&](const ReplicaInfo& m) { return m.id == writer; });
    if (!member) part = rank;
  }
  if (part < 0) {
    log_(absl::StrCat("checkpoint of step ", step, " has no per-replica state for replica '",
                      self_id, "' (rank ", rank, " of ", generation.size(), ", written by ",
                      parts->size(), "): it keeps its initial per-replica state"));
    return absl::OkStatus();
  }
  if (auto st = mgr_->RestorePerReplica(per_replica, step, part); !st.ok()) return st;
  log_(absl::StrCat("restored the per-replica state of part ", part, " ('",
                    (*parts)[part].replica_id, "') of step ", step));
  return absl::OkStatus();
}

absl::StatusOr<std::optional<int64_t>> JobSaves::CatchUp(int64_t step, ElasticGroup& group,
                                                         const StateRegistry& replicated,
                                                         const StateRegistry& per_replica,
                                                         const std::string& self_id) {
  // The newest valid checkpoint this replica sees (List: newest first; -1:
  // none, or the directory could not be listed: another replica's view
  // decides).
  int64_t newest = -1;
  if (absl::StatusOr<std::vector<CheckpointInfo>> list = mgr_->List(); !list.ok()) {
    log_(absl::StrCat("could not list the checkpoints: ", list.status().ToString()));
  } else if (!list->empty()) {
    newest = list->front().step;
  }
  // One collective: the maximum of (dev, ino, -dev, -ino, newest) over the
  // replicas says whether all use this directory and gives the newest step.
  std::vector<int64_t> v = {dev_, ino_, -dev_, -ino_, newest};
  if (auto st = group.AllReduce(v.data(), v.size(), DType::kI64, ReduceOp::kMax); !st.ok()) {
    return absl::AbortedError(absl::StrCat(
        "the replicas could not compare their state with the checkpoints: ", st.ToString()));
  }
  if (!SameDirectory(v) || v[4] <= step) return std::nullopt;
  const int64_t target = v[4];
  absl::StatusOr<CheckpointManager::RestoreResult> r = mgr_->RestoreReplicated(replicated, target);
  if (!r.ok()) {
    return absl::Status(r.status().code(), absl::StrCat("catching up with the checkpoint of step ",
                                                        target, " (the group's state is of step ",
                                                        step, "): ", r.status().message()));
  }
  log_(absl::StrCat("the group's state (step ", step, ") is older than the checkpoint ",
                    r->info.path, ": caught up with its replicated state"));
  if (auto st = RestorePerReplica(per_replica, target, group.generation(), self_id); !st.ok()) {
    return st;
  }
  return target;
}

absl::StatusOr<JobSaveStats> JobSaves::SaveTogether(
    int64_t step, ElasticGroup& group, const StateRegistry& replicated,
    const StateRegistry& per_replica, const std::map<std::string, std::string>& metadata) {
  // One collective: the minimum of (dev, ino, -dev, -ino, -nonce) over the
  // replicas says whether all use this directory and gives every replica
  // the same token (the largest nonce).
  uint64_t nonce = 0;
  if (::getrandom(&nonce, sizeof(nonce), 0) != static_cast<ssize_t>(sizeof(nonce))) {
    nonce = static_cast<uint64_t>(step) * 0x9E3779B97F4A7C15ull;
  }
  std::vector<int64_t> v = {dev_, ino_, -dev_, -ino_,
                            -static_cast<int64_t>(nonce & 0x3fffffffffffffffull)};
  if (auto st = group.AllReduce(v.data(), v.size(), DType::kI64, ReduceOp::kMin); !st.ok()) {
    // Aborted whatever the collective's code: a peer is gone, nothing was
    // written; the group recovers at its next collective.
    return absl::AbortedError(absl::StrCat(
        "checkpoint step ", step, ": the replicas could not agree on the save: ", st.ToString()));
  }
  if (!SameDirectory(v)) {
    if (!told_separate_) {
      log_(
          "the replicas use different checkpoint directories: each saves its own checkpoints "
          "(give them one shared directory for job-level checkpoints)");
      told_separate_ = true;
    }
    return mgr_->SaveAlone(step, replicated, per_replica, metadata);
  }
  const Generation gen = group.generation();
  JobSaveGroup g;
  g.rank = gen.rank;
  g.size = gen.size();
  g.token = static_cast<uint64_t>(-v[4]);
  Membership& membership = group.membership();
  g.check = [&membership]() {
    const std::vector<std::string> dead = membership.DeadPeers();
    if (dead.empty()) return absl::OkStatus();
    return absl::AbortedError(
        absl::StrCat("replica(s) ", absl::StrJoin(dead, ", "), " died during the save"));
  };
  return mgr_->Save(step, g, replicated, per_replica, metadata);
}

}  // namespace omni::internal
