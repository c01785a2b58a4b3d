// String helpers for the implementation (private).
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace omni::internal {

// Debian's abseil has its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW
// 0); newer builds alias std::string_view. This converts in both cases.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace omni::internal
