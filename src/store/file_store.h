// The file backend of OpenStore (private; see omni/store.h and
// src/store/file_store.cc for the directory layout).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/fs.h"
#include "omni/export.h"
#include "omni/store.h"

namespace omni::internal {

// A Store in the directory `dir` (an absolute path; created if missing).
// With `durable`, every write is fsynced (the value, then the directory)
// before it returns, so it survives a crash of the host; without, a host
// crash may lose recent writes (each key then holds its previous value).
// The OS error naming the directory when it cannot be created or written.
absl::StatusOr<std::unique_ptr<Store>> OpenFileStore(std::string dir, bool durable = false);

// The same on the file system `fs` (tests: a fault-injecting one), which
// must outlive the store. Exported for tests/unit/file_store_fault_test.cc.
OMNI_EXPORT absl::StatusOr<std::unique_ptr<Store>> OpenFileStoreOn(std::string dir, bool durable,
                                                                   FileSystem& fs);

}  // namespace omni::internal
