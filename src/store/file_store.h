// The file backend of OpenStore (private; see omni/store.h and
// src/store/file_store.cc for the directory layout).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "omni/store.h"

namespace omni::internal {

// A Store in the directory `dir` (an absolute path; created if missing).
// The OS error naming the directory when it cannot be created or written.
absl::StatusOr<std::unique_ptr<Store>> OpenFileStore(std::string dir);

}  // namespace omni::internal
