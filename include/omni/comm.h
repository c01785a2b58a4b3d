// Collective communication over raw buffers, for the data-parallel replicas
// of an elastic job. One Communicator is built per membership generation,
// rendezvousing through a Store view that belongs to that generation only, so
// nothing from an older world is ever read.
//
//   omni::CommOptions o;
//   o.backend = "gloo";                       // CPU; "nccl" for CUDA buffers
//   o.rank = view.rank; o.size = view.size;
//   o.store = generation_store.get();         // e.g. MakePrefixStore(store, "gen/7/comm")
//   auto comm = omni::CreateCommunicator(o);
//   (*comm)->AllReduce(grads, n, omni::DType::kF32, omni::ReduceOp::kSum,
//                      absl::Seconds(10));
//
// Failure model: every call has a timeout and returns an error instead of
// hanging: DeadlineExceeded when a peer does not answer in time, Unavailable
// when a peer's connection is lost (it died), Aborted after Abort(). The first
// error breaks the communicator for good (its peers may be in any state):
// every later call fails with that same error, and the owner builds a new one
// for the next generation. Buffers are left unspecified after a failed call.
//
// Memory: gloo takes host memory only. nccl takes CUDA device memory of its
// device (CommOptions::device) as it is, and host memory too (pageable or
// pinned; found with cudaPointerGetAttributes): the nccl communicator copies
// it through a device staging buffer, at most 64 MiB at a time, one NCCL
// collective per chunk — slower than device memory, meant for small or rare
// transfers (the elastic group's digests and state, a loss, a flag per
// parameter). Because the chunking follows the kind of memory, every rank
// passes the same kind (host or device) to one call.
//
// A call with bad arguments (a null buffer with a non-zero size, a root out
// of range, a timeout <= 0, nccl: device memory of another device) returns
// InvalidArgument without communicating and without breaking the
// communicator. A call with nothing to move (count or bytes 0) returns OK
// (or the sticky error) without communicating.
//
// Thread safety: the collectives of one communicator must be called from one
// thread at a time, in the same order on every rank. Abort(), AsyncError(),
// rank(), size() and backend() may be called from any thread at any time.
// Destroying a communicator while another thread uses it is not allowed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "omni/export.h"
#include "omni/state.h"
#include "omni/store.h"

namespace omni {

// Communicators take omni::DType (state.h), the one dtype enum of Omni, and
// reduce kF32, kF64, kI32, kI64 and kU8; other dtypes are refused
// (InvalidArgument naming the dtype). `DataType` is its former name here.
using DataType = DType;
enum class ReduceOp { kSum, kAvg, kMin, kMax };

// Bytes per element of `type` when communicators reduce it, else 0.
OMNI_EXPORT size_t DataTypeSize(DType type);
// The communicators' name of `type` ("float32", "int64"...), "unsupported"
// for a dtype they do not reduce.
OMNI_EXPORT const char* DataTypeName(DType type);
OMNI_EXPORT const char* ReduceOpName(ReduceOp op);

struct CommOptions {
  // "gloo" (host memory, TCP) or "nccl" (CUDA device memory; host memory
  // is staged, see the file comment).
  std::string backend = "gloo";
  int rank = 0;
  int size = 1;
  // Where the ranks find each other. Not owned; used only during
  // CreateCommunicator. Give every communicator a store view (prefix) of its
  // own: keys are written once and never cleaned up by the communicator.
  Store* store = nullptr;
  // Bound on the rendezvous (every rank must arrive within it) and on
  // connection setup.
  absl::Duration init_timeout = absl::Seconds(60);
  // gloo: the address or host name to listen on and to publish to peers.
  std::string host = "127.0.0.1";
  // nccl: the CUDA device ordinal; -1 picks rank % (visible devices).
  int device = -1;
  // Optional: asked every few milliseconds while the rendezvous waits for
  // its peers' keys, and while the connections to them are set up (gloo's
  // pairs connecting, NCCL's non-blocking init);
  // returning true abandons it (Aborted, "rendezvous abandoned").
  // ElasticGroup answers "a member of this generation was seen dead, or
  // gave up on it", so that a member that dies or recovers after its
  // generation was agreed costs a recovery instead of init_timeout. Called
  // on the creating thread only; must not wait (a store read is fine).
  std::function<bool()> abandon;
};

class OMNI_EXPORT Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;

  // In place over `count` elements of `type` at `data`. kAvg divides the sum
  // by size() (integers: truncating).
  virtual absl::Status AllReduce(void* data, size_t count, DType type, ReduceOp op,
                                 absl::Duration timeout) = 0;
  // `bytes` bytes at `data` of rank `root` are copied to every rank's `data`.
  virtual absl::Status Broadcast(void* data, size_t bytes, int root, absl::Duration timeout) = 0;
  // Every rank contributes `bytes` bytes at `in`; `out` (size() * bytes) gets
  // rank r's bytes at offset r * bytes, on every rank.
  virtual absl::Status AllGather(const void* in, size_t bytes, void* out,
                                 absl::Duration timeout) = 0;
  // Returns once every rank has entered Barrier.
  virtual absl::Status Barrier(absl::Duration timeout) = 0;

  // Breaks the communicator: a call waiting in another thread returns
  // Aborted promptly, and so does every later call. Idempotent.
  virtual void Abort() = 0;
  // OK while healthy; otherwise the error that broke it (the first one).
  virtual absl::Status AsyncError() const = 0;

  // Optional. The communicator of the ranks of this one that are not in
  // `excluded`, without a new rendezvous: every remaining rank calls it with
  // the same `excluded` (the excluded ranks do not call it); ranks keep their
  // order and are renumbered densely from 0. Unimplemented and
  // InvalidArgument leave this communicator as it was; any other error breaks
  // it. On success this communicator stays usable too (and still includes
  // the excluded ranks; destroy it once done). Errors: Unimplemented when the
  // backend (gloo) or the loaded library (NCCL < 2.27, which has no
  // ncclCommShrink) cannot shrink — the caller then builds a new
  // communicator from scratch through CreateCommunicator; InvalidArgument for
  // an excluded rank out of range, repeated, or equal to rank(), or for
  // excluding no rank or every rank; FailedPrecondition when this communicator is
  // already broken (its AsyncError() names why); DeadlineExceeded when the
  // remaining ranks do not agree within `timeout`.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Shrink(const std::vector<int>& excluded,
                                                               absl::Duration timeout);
};

// Builds the communicator of `options.rank` among `options.size` ranks; every
// rank must call it with the same backend, size and store view. Errors:
// InvalidArgument naming the field (rank/size out of range, no store, unknown
// backend); Unimplemented when the backend was not built in; DeadlineExceeded
// naming the ranks that did not arrive within init_timeout (init_timeout
// must be > 0); FailedPrecondition naming the CUDA error for NCCL without a
// usable CUDA device; Unavailable when a peer arrived but could not be
// connected. Never hangs past init_timeout (plus the teardown of a partly
// built NCCL communicator).
OMNI_EXPORT absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    const CommOptions& options);

}  // namespace omni
