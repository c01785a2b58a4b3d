// Polling helpers shared by the Store backends (private; src/store/poll.cc).
//
// Thread safety: stateless; they call the store they are given, which must
// be thread-safe itself for concurrent callers.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "omni/store.h"

namespace omni::internal {

// Calls `ready` with a backoff of 0.1 ms doubling up to 2 ms until it
// returns true (-> true), an error (-> the error) or `timeout` has passed
// (-> false). `ready` is called at least once.
absl::StatusOr<bool> PollUntil(absl::Duration timeout,
                               const std::function<absl::StatusOr<bool>()>& ready);

// Store::Get by polling store.TryGet; DeadlineExceeded starts with `label`
// and names the key and the timeout.
absl::StatusOr<std::string> PollGet(Store& store, const std::string& key, absl::Duration timeout,
                                    const std::string& label);

// Store::Wait by polling store.TryGet; DeadlineExceeded starts with `label`
// and names the keys still missing.
absl::Status PollWait(Store& store, const std::vector<std::string>& keys, absl::Duration timeout,
                      const std::string& label);

}  // namespace omni::internal
