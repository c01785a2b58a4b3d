// Shared pieces of the communicator backends (private).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "omni/comm.h"
#include "omni/store.h"

namespace omni::internal {

// The backends. Called by CreateCommunicator with options already validated
// (rank/size in range, store set, init_timeout > 0). Each is defined only when
// its library was found (OMNI_HAVE_GLOO / OMNI_HAVE_NCCL).
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(const CommOptions& options);
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(const CommOptions& options);

// Arrival barrier of a rendezvous: sets "arrive/<rank>" in `store`, then waits
// until every rank's key exists or `deadline` passes. DeadlineExceeded naming
// the ranks that did not arrive (e.g. "gloo rendezvous: rank(s) 2, 3 of 4 did
// not arrive within 2s"); Aborted once `abandon` (CommOptions::abandon; may
// be empty) says so.
absl::Status WaitForRanks(Store& store, int rank, int size, absl::Time deadline,
                          absl::Duration init_timeout, const std::function<bool()>& abandon,
                          const std::string& what);

// Store::Get and Store::Wait for a rendezvous: in slices of at most 20 ms
// until `deadline` (then the store's DeadlineExceeded), asking `abandon`
// (when set) before each slice: Aborted "<what> rendezvous abandoned while
// waiting for <key>" as soon as it returns true.
absl::StatusOr<std::string> RendezvousGet(Store& store, const std::string& key, absl::Time deadline,
                                          const std::function<bool()>& abandon,
                                          const std::string& what);
absl::Status RendezvousWait(Store& store, const std::vector<std::string>& keys, absl::Time deadline,
                            const std::function<bool()>& abandon, const std::string& what);

// The first half of WaitForRanks: sets "arrive/<rank>" (a rendezvous that
// waits for its peers in another way calls MissingRanksError on timeout).
absl::Status AnnounceRank(Store& store, int rank, const std::string& what);

// DeadlineExceeded naming the ranks whose "arrive/<rank>" key is missing; OK
// when none is.
absl::Status MissingRanksError(Store& store, int rank, int size, absl::Duration init_timeout,
                               const std::string& what);

// InvalidArgument naming the argument when `timeout` is not > 0.
absl::Status CheckTimeout(absl::Duration timeout, const char* call);

// The arguments of each collective, checked the same way for every backend:
// InvalidArgument naming the argument (timeout, data type, null buffer with
// a non-zero size, root out of range, a size that overflows).
absl::Status CheckAllReduceArgs(const void* data, size_t count, DType type, absl::Duration timeout);
absl::Status CheckBroadcastArgs(const void* data, size_t bytes, int root, int size,
                                absl::Duration timeout);
absl::Status CheckAllGatherArgs(const void* in, size_t bytes, const void* out, int size,
                                absl::Duration timeout);

// "AllReduce" etc. plus the size, for error messages.
std::string CallName(const char* call, size_t bytes);

}  // namespace omni::internal
