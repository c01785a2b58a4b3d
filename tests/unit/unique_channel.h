// A window channel name no other test process uses (omni/window_channel.h).
#pragma once

#include <unistd.h>

#include <atomic>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace omni::testing {

// "omni-<what>-<pid>-<n>": unique per process and call.
inline std::string UniqueChannel(absl::string_view what) {
  static std::atomic<int> n{0};
  return absl::StrCat("omni-", what, "-", ::getpid(), "-", n.fetch_add(1));
}

}  // namespace omni::testing
