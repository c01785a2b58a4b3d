// Small helpers shared by the per-rank checkpointer (checkpoint.cc) and the
// job checkpointer (job_checkpoint.cc): wall time for manifests, random ids
// for save ids and trash names, timings, user callbacks kept from throwing
// across the API, and bounded polling of a shared directory.
//
// Thread safety: the functions are thread-safe; a Poller is one caller's.
#pragma once

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace omni::internal {

// Milliseconds since the Unix epoch (manifests record when they were made).
inline int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// 64 random bits from getrandom(2); the time and pid mixed when it fails.
inline uint64_t RandomId() {
  uint64_t v = 0;
  if (::getrandom(&v, sizeof(v), 0) != static_cast<ssize_t>(sizeof(v))) {
    v = static_cast<uint64_t>(NowUnixMs()) * 0x9E3779B97F4A7C15ull ^
        static_cast<uint64_t>(::getpid());
  }
  return v;
}

inline double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Runs a callback into user code (Stateful::Save / Load), turning an
// exception into a Status so that none crosses the API (or kills a
// background thread). `what`: "saving", "loading", ...
template <typename Fn>
absl::Status Guard(const char* what, Fn&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("exception while ", what, " the state: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat("unknown exception while ", what, " the state"));
  }
}

// Bounded polling: waits of 1 ms, doubling up to `max_delay`, until
// `timeout` has passed.
class Poller {
 public:
  Poller(absl::Duration timeout, absl::Duration max_delay)
      : deadline_(absl::Now() + timeout), max_delay_(max_delay) {}
  bool Expired() const { return absl::Now() >= deadline_; }
  void Wait() {
    absl::SleepFor(delay_);
    delay_ = std::min(delay_ * 2, max_delay_);
  }

 private:
  absl::Time deadline_;
  absl::Duration max_delay_;
  absl::Duration delay_ = absl::Milliseconds(1);
};

}  // namespace omni::internal
