// The etcd backend of OpenStore (private; see omni/store.h and
// src/store/etcd_store.cc). Built when libcurl is found (OMNI_HAVE_ETCD).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "omni/store.h"

namespace omni::internal {

// A Store on the etcd cluster at `endpoints` ("host:port[,host:port...]",
// each an etcd client URL's host and port over plain HTTP), through etcd's
// v3 JSON gateway. InvalidArgument naming `uri` for a malformed endpoint
// list; nothing is contacted until the first call.
absl::StatusOr<std::unique_ptr<Store>> OpenEtcdStore(const std::string& uri,
                                                     const std::string& endpoints);

}  // namespace omni::internal
