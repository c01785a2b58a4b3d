// Keeping the telemetry outputs of earlier runs (private): a resumed job's
// step log and trace are not truncated but moved aside.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace omni::internal {

// When `path` exists, renames it to the first free "<path>.N" (N = 1, 2, ...),
// so the outputs of successive runs are kept in the order they were written.
// Returns the name it moved `path` to, or "" when there was nothing to move;
// errors name both paths.
absl::StatusOr<std::string> MoveAside(const std::string& path);

}  // namespace omni::internal
