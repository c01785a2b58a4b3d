// Membership of an elastic data-parallel job: which replicas train together,
// as a sequence of generations agreed through a Store.
//
// A replica is one data-parallel copy of the model (a block of TP x PP ranks
// in a large job; one process in omni_train). Each change of membership —
// the first formation, a join admitted at a step boundary, the loss of a
// replica — is a new generation N, stored once under "gen/N" by
// compare-and-set (the first proposal wins; everyone adopts it). Everything a
// generation builds (communicators) lives under the store prefix
// "gen/N/...", so nothing from an older world is ever read.
//
// Liveness: every replica's background thread bumps a heartbeat counter
// ("hb/<id>") every `heartbeat`. Observers remember, on their own monotonic
// clock, when they last saw each counter change; a replica whose counter has
// not changed for `peer_timeout` is dead. Wall clocks are never compared, not
// even between processes of one host. On a store with leases
// (Store::has_leases(), etcd://) the heartbeat key is written with
// SetWithLease(peer_timeout), so a dead replica's key also vanishes when its
// lease expires; a heartbeat key seen before and now gone counts as silent
// for peer_timeout already.
//
// Time: every timing here is on options.clock — the heartbeat period, the
// peer, join, settle and store-retry bounds, the bound on a stuck member in
// Recover, and every wait between polls and retries. Membership reads the
// store only with calls that do not wait (TryGet, Set, Add, CompareAndSet),
// never with the store's own blocking Get or Wait, whose timeouts are real
// time; so on a FakeClock no wait of this class takes real time, and the
// clock must be moved while Create, Join and Recover wait and while the
// heartbeat thread runs (tests/unit/auto_advance.h does so).
//
// Ranks: members are ordered by (switch, rack, host, id), so that replicas
// under one switch, and within it one rack, get contiguous ranks.
//
// Typical use (ElasticGroup in omni/elastic.h wraps this together with a
// communicator and state transfer):
//
//   auto m = omni::Membership::Create(store, options);   // starts heartbeats
//   auto gen = (*m)->Join();                   // blocks until admitted
//   for (;;) {
//     auto next = (*m)->AtBoundary(step);      // a change agreed for here?
//     ... allreduce; on failure: gen = (*m)->Recover(step);
//   }
//
// The store's own failures. Every record this class writes carries the job's
// store incarnation (a random token the first replica writes once under
// "incarnation"), and every member checks at each heartbeat that the store
// still holds it. When the coordination store fails for good, Join,
// AtBoundary and Recover return an error for which IsStoreFailure() is true:
//   - DataLoss: the store lost its state (key 'incarnation' missing or
//     replaced: wiped, replaced, or restarted empty under the running job;
//     newcomers on it would form a second job), or it holds a malformed
//     record (the message names the key and the field);
//   - Unavailable: the store was unreachable for store_retry (its server
//     died with the replica that hosted it).
// The group cannot go on, but this replica's state is intact: nothing of a
// step in flight was committed by the group. Save locally (a checkpoint at
// the completed steps) and stop; a job restarted on a healthy store resumes
// from it. A lost peer is never a store failure.
// With an authenticated store (omni/auth_store.h), records the store refuses
// as forged (PermissionDenied) count as absent: a forged generation is
// replaced by the members' own, a forged join ticket is never admitted.
//
// Thread safety: Join, AtBoundary and Recover are called by one thread (the
// training thread); the accessors may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "omni/clock.h"
#include "omni/export.h"
#include "omni/store.h"

namespace omni {

struct ReplicaInfo {
  std::string id;    // unique within the job: [A-Za-z0-9_.-], 1..64 characters
  std::string host;  // informational, and a placement key
  std::string rack;  // topology labels ("" = unknown)
  std::string switch_name;
  // Set by Membership (ignored in options.self): the process that holds the
  // id, so that a replica restarted with the same id is not mistaken for
  // the process that was a member before (its generation, its heartbeats).
  std::string session;
};

struct MembershipOptions {
  // Identifies the job. The first replica records it in the store; a replica
  // with another job id is refused (FailedPrecondition naming both).
  std::string job_id;
  // Identifies the model (e.g. a digest of parameter names, dtypes, shapes).
  // Recorded by the first replica; a replica with another digest is refused.
  std::string model_digest;
  ReplicaInfo self;
  int min_replicas = 1;
  int max_replicas = 1024;
  absl::Duration heartbeat = absl::Milliseconds(100);
  absl::Duration peer_timeout = absl::Seconds(1);
  // How long Join waits to be admitted, and Recover waits while fewer than
  // min_replicas are alive, before giving up with DeadlineExceeded.
  absl::Duration join_timeout = absl::Minutes(5);
  // First formation: once min_replicas have registered, wait until no new
  // replica has registered for this long (or max_replicas are there).
  absl::Duration settle = absl::Milliseconds(300);
  // Store errors (unreachable store) are retried with backoff for this long,
  // then reported (Unavailable naming the key and the last error).
  absl::Duration store_retry = absl::Seconds(10);
  // Times everything above (see "Time" at the top of this file). Not owned;
  // must outlive the Membership. Null is refused (InvalidArgument).
  const Clock* clock = Clock::Real();
};

// How a generation came about. Stored in generation records as its name
// (GenerationKindName: "initial", "join", "leave", "recover").
enum class GenerationKind : uint8_t {
  kInitial,  // first formation, or re-formation after every member died
  kJoin,     // planned at a step boundary
  kLeave,    // a graceful leave, planned at a step boundary
  kRecover,  // after a failure
};
// "initial", "join", "leave" or "recover".
OMNI_EXPORT const char* GenerationKindName(GenerationKind kind);
// The kind named `name`; InvalidArgument naming it for any other text.
OMNI_EXPORT absl::StatusOr<GenerationKind> ParseGenerationKind(std::string_view name);

struct OMNI_EXPORT Generation {
  int64_t number = 0;
  GenerationKind kind = GenerationKind::kInitial;
  // For kJoin: the boundary (number of completed steps) at which every
  // member switches to this generation. For others: informational (the
  // proposer's completed steps).
  int64_t at_step = 0;
  std::vector<ReplicaInfo> members;  // in rank order
  std::vector<std::string> joined;   // ids new in this generation
  std::vector<std::string> left;     // ids of the previous one not in this one
  int rank = -1;                     // this replica's rank; -1: not a member

  int size() const { return static_cast<int>(members.size()); }
  // The store prefix of everything built for this generation.
  std::string prefix() const { return "gen/" + std::to_string(number); }
  // One line for logs: "generation 3 (recover): 3 replicas [r0 r1 r3], left r2".
  std::string ToString() const;
};

class OMNI_EXPORT Membership {
 public:
  // Validates the options (InvalidArgument naming the field), checks the
  // job id and model digest against the store's (FailedPrecondition naming
  // both values when they differ), refuses an id already used by a live
  // member (AlreadyExists), and starts the heartbeat thread. The store must
  // outlive the Membership.
  static absl::StatusOr<std::unique_ptr<Membership>> Create(Store& store,
                                                            const MembershipOptions& options);
  virtual ~Membership() = default;

  // Blocks until this replica is a member of a generation: it registers a
  // join request, and either forms the first generation with the others
  // that registered (once min_replicas are there), or is admitted by the
  // current members at one of their step boundaries. Also the way back in
  // for a replica that was evicted (e.g. frozen past peer_timeout).
  virtual absl::StatusOr<Generation> Join() = 0;

  // Called at every step boundary, `completed` steps done. Returns the next
  // generation when one takes effect at this boundary (every member gets it
  // at the same boundary), nullopt otherwise. Proposes one when join
  // requests are pending and there is room (max_replicas). A returned
  // generation with rank -1 means this replica was evicted: call Join().
  // One store read per call when nothing changes.
  virtual absl::StatusOr<std::optional<Generation>> AtBoundary(int64_t completed) = 0;

  // After a collective of the current generation failed: agrees with the
  // surviving members on the next generation. Members that report in are
  // kept; one that does not is dropped once its heartbeat has been silent
  // for three heartbeat periods (at most peer_timeout), or, while it keeps
  // beating, after 10 peer_timeouts (its training thread is stuck). The
  // members that joined in the current generation may lack the group's
  // state (the failure may have come before their sync): unless a member
  // that was there before reported in, such a member is dropped only once
  // silent for the full peer_timeout, and never while it beats, so that
  // joiners do not go on alone from their older state. Waits (up to
  // join_timeout) while fewer than min_replicas are alive. When this
  // replica was itself dropped it joins again (as Join()).
  virtual absl::StatusOr<Generation> Recover(int64_t completed) = 0;

  // Marks the job as finished (store key "finished"): a replica still
  // waiting in Join, and any that starts later, gets FailedPrecondition
  // saying so instead of waiting for admission. Call it once training is
  // complete (every member may; it is idempotent).
  virtual absl::Status Finish() = 0;

  // A graceful leave: proposes the next generation without this replica
  // (kind "leave"), taking effect for every member at the boundary after
  // `completed` + 1 steps, where AtBoundary returns it (rank -1 here).
  // FailedPrecondition when the others would be fewer than min_replicas (or
  // this replica is not a member); Unavailable when another change of the
  // generation is already pending (ask again at the next boundary).
  virtual absl::Status RequestLeave(int64_t completed) = 0;

  // The generation this replica is in (number 0 before Join).
  virtual Generation current() const = 0;

  // Called from the heartbeat thread (without locks held) when a member of
  // the current generation is first seen dead, with its id; e.g. to abort
  // the communicator so that a collective waiting for it returns now.
  virtual void SetOnPeerDead(std::function<void(const std::string& id)> callback) = 0;

  // Ids of the current generation's members seen dead so far.
  virtual std::vector<std::string> DeadPeers() const = 0;
  // True when generation `g` can no longer come together: one of its
  // members gave up on it (reported in to its Recover), or a newer
  // generation exists. E.g. for a communicator's rendezvous to stop
  // waiting for a member that went on to recover. Reads two store keys,
  // without waiting or retrying (a store error reads as false), whatever
  // the generation's size. Called by the training thread.
  virtual bool Superseded(const Generation& g) = 0;
  // The last heartbeat error (store unreachable), OK when none.
  virtual absl::Status HeartbeatError() const = 0;
  // The store failure seen by the heartbeat thread (see the top of this
  // file), latched; OK while none. Join, AtBoundary and Recover return it.
  virtual absl::Status StoreFailure() const { return absl::OkStatus(); }
};

// True when `status` is a store failure (see the top of this file): the
// caller should save locally and stop. Kept by ElasticGroup's errors.
OMNI_EXPORT bool IsStoreFailure(const absl::Status& status);
// `status` marked as a store failure (OK stays OK).
OMNI_EXPORT absl::Status MarkStoreFailure(absl::Status status);

}  // namespace omni
