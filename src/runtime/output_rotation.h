// Keeping the telemetry outputs of earlier runs (private): a resumed job's
// step log and trace are not truncated but moved aside.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace omni::internal {

// When `path` exists, renames it to the first free "<path>.N" (N = 1, 2, ...),
// so the outputs of successive runs are kept in the order they were written.
// OK when there is nothing to move; errors name both paths.
absl::Status MoveAside(const std::string& path);

}  // namespace omni::internal
