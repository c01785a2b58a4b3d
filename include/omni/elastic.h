// Elastic data parallelism: a group of data-parallel replicas that survives
// the loss of replicas and admits new ones at step boundaries. It combines
// Membership (generations, heartbeats), a Communicator per generation, and
// the transfer of the replicated training state to replicas that lack it.
//
//   omni::ElasticGroup::Create(store, options, replicated_state)
//   group->Start(step)                    // join, build, get the state
//   loop:
//     group->AtBoundary(step)             // maybe a new generation here
//     compute local gradients for this rank's share of the global batch
//     st = group->AllReduce(grads...)     // on failure: do not commit,
//     if (!st.ok()) { group->Recover(st, step); redo the step; }
//     commit (optimizer step, sampler cursor, step counter)
//
// After every change of generation the replicas exchange (completed steps,
// state digest); when they differ, the member with the most completed steps
// (the lowest rank among equals) broadcasts its replicated state
// (SerializeState, state.h) over the new communicator, and every receiver
// verifies it against the sender's XXH3 digest before loading it.
// Afterwards every replica's replicated state is bit-identical. Per-replica
// state (RNGs) is not part of it: keep it in another registry (checkpoints
// save it per rank).
//
// When a collective fails (a peer died or froze), nothing of that step must
// be committed: Recover() agrees on the survivors, rebuilds the
// communicator, re-synchronises the state (a replica that did commit the
// failed step hands it to the others) and the caller redoes the step.
//
// Time: options.membership.clock times the group — its membership's
// heartbeats, timeouts and waits (omni/membership.h), and the agree, build
// and sync durations of GroupChange. collective_timeout and init_timeout are
// real time on any clock: they bound the communicator's sockets and its
// rendezvous through the store's own blocking waits. A peer that dies is
// still found on the clock (its heartbeat), and the collective or the build
// that waits for it is aborted then, so on a FakeClock no real-time bound is
// waited out for a lost peer.
//
// Thread safety: one training thread calls everything except generation()
// and backend(), which are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "omni/comm.h"
#include "omni/export.h"
#include "omni/membership.h"
#include "omni/state.h"
#include "omni/store.h"

namespace omni {

struct ElasticOptions {
  // membership.clock is the group's clock (see "Time" above).
  MembershipOptions membership;
  std::string backend = "gloo";  // see CommOptions
  std::string host = "127.0.0.1";
  // nccl: the CUDA device of this replica (where its model lives, e.g.
  // LOCAL_RANK); -1 picks the generation rank % visible devices, which
  // changes with the generation: set it whenever a host has several GPUs.
  int device = -1;
  // Every collective's timeout, in real time: a backstop for a peer whose
  // process is alive but stuck (a dead or frozen peer is detected by
  // heartbeat first, and the waiting collective aborted).
  absl::Duration collective_timeout = absl::Seconds(60);
  // Bound on building a generation's communicator, in real time.
  absl::Duration init_timeout = absl::Seconds(30);
};

// What happened at a change of generation.
struct GroupChange {
  Generation generation;
  int source_rank = -1;  // whose state was taken; -1 when all were equal
  bool state_received = false;
  size_t state_bytes = 0;  // bytes broadcast (0 when all were equal)
  int64_t completed = 0;   // completed steps after the change (the source's)
  double agree_ms = 0;     // membership agreement (Join / Recover / boundary)
  double build_ms = 0;     // communicator rendezvous and connection
  double sync_ms = 0;      // state digest exchange and transfer
};

class OMNI_EXPORT ElasticGroup {
 public:
  // `replicated` is the state that every replica holds identically (model,
  // optimizer, LR schedule, data cursor, step counter); it must outlive the
  // group. Errors as Membership::Create.
  static absl::StatusOr<std::unique_ptr<ElasticGroup>> Create(Store& store,
                                                              const ElasticOptions& options,
                                                              const StateRegistry& replicated);
  virtual ~ElasticGroup() = default;

  // Joins (Membership::Join), builds the communicator and synchronises the
  // state. `completed`: steps this replica has completed (e.g. restored from
  // its checkpoint, else 0). After it returns, read the step counter back
  // from the replicated state: it may have been replaced.
  virtual absl::StatusOr<GroupChange> Start(int64_t completed) = 0;

  // At every step boundary: when a new generation takes effect here, builds
  // it (and synchronises the state) and returns what changed.
  virtual absl::StatusOr<std::optional<GroupChange>> AtBoundary(int64_t completed) = 0;

  // A collective of the current generation with collective_timeout.
  virtual absl::Status AllReduce(void* data, size_t count, DType type, ReduceOp op) = 0;
  virtual absl::Status Broadcast(void* data, size_t bytes, int root) = 0;

  // After a failed collective (`failure`, for the log): agrees on the next
  // generation with the survivors, rebuilds and synchronises. The caller
  // then redoes the step it had not committed. Retries while building a
  // generation fails (another replica lost meanwhile).
  virtual absl::StatusOr<GroupChange> Recover(const absl::Status& failure, int64_t completed) = 0;

  // A graceful leave (Membership::RequestLeave): the others build the next
  // generation without this replica at the boundary after `completed` + 1
  // steps, without waiting for a heartbeat timeout. There, AtBoundary
  // returns a change whose generation has rank -1 and closes this replica's
  // communicator: save what is needed and exit. Errors as RequestLeave.
  virtual absl::Status Leave(int64_t completed) = 0;

  // The current generation (Membership::current()); rank -1 after this
  // replica left.
  virtual Generation generation() const = 0;
  // ElasticOptions::backend, the kind of memory the collectives take (see
  // comm.h): "nccl" takes CUDA memory of ElasticOptions::device as it is
  // and host memory staged through it; "gloo" host memory only.
  virtual const std::string& backend() const = 0;
  // The current generation's communicator (replaced at each change: do not
  // keep the reference across AtBoundary, Recover or Start).
  virtual Communicator& comm() = 0;
  // The membership underneath (heartbeats, dead peers, store failures).
  virtual Membership& membership() = 0;
};

}  // namespace omni
