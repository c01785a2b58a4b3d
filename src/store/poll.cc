// Polling helpers shared by the Store backends (poll.h).
#include "store/poll.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace omni::internal {
namespace {

constexpr absl::Duration kMinBackoff = absl::Microseconds(100);
constexpr absl::Duration kMaxBackoff = absl::Milliseconds(2);

}  // namespace

absl::StatusOr<bool> PollUntil(absl::Duration timeout,
                               const std::function<absl::StatusOr<bool>()>& ready) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = kMinBackoff;
  for (;;) {
    absl::StatusOr<bool> r = ready();
    if (!r.ok() || *r) return r;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    absl::SleepFor(std::min(backoff, left));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

absl::StatusOr<std::string> PollGet(Store& store, const std::string& key, absl::Duration timeout,
                                    const std::string& label) {
  std::optional<std::string> value;
  absl::StatusOr<bool> found = PollUntil(timeout, [&]() -> absl::StatusOr<bool> {
    absl::StatusOr<std::optional<std::string>> v = store.TryGet(key);
    if (!v.ok()) return v.status();
    if (!v->has_value()) return false;
    value = std::move(**v);
    return true;
  });
  if (!found.ok()) return found.status();
  if (!*found) {
    return absl::DeadlineExceededError(absl::StrCat(label, ": key '", key, "' still missing after ",
                                                    absl::FormatDuration(timeout)));
  }
  return std::move(*value);
}

absl::Status PollWait(Store& store, const std::vector<std::string>& keys, absl::Duration timeout,
                      const std::string& label) {
  std::vector<std::string> missing = keys;
  absl::StatusOr<bool> done = PollUntil(timeout, [&]() -> absl::StatusOr<bool> {
    std::vector<std::string> still;
    for (const std::string& key : missing) {
      absl::StatusOr<std::optional<std::string>> v = store.TryGet(key);
      if (!v.ok()) return v.status();
      if (!v->has_value()) still.push_back(key);
    }
    missing = std::move(still);
    return missing.empty();
  });
  if (!done.ok()) return done.status();
  if (!*done) {
    return absl::DeadlineExceededError(
        absl::StrCat(label, ": key(s) '", absl::StrJoin(missing, "', '"), "' still missing after ",
                     absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

}  // namespace omni::internal
