// What the NCCL path can use on this host. The NCCL code is compiled whenever
// the CUDA toolkit and NCCL were found at build time (OMNI_HAVE_NCCL), so that
// it builds everywhere even where it cannot run.
#pragma once

#include "absl/status/statusor.h"
#include "omni/config.h"
#include "omni/export.h"

namespace omni {

struct NcclRuntimeInfo {
  int compiled_version = 0;  // NCCL_VERSION_CODE of the headers built against.
  int runtime_version = 0;   // ncclGetVersion() of the library loaded now.
  int cuda_devices = 0;      // visible CUDA devices.
  // ncclCommShrink (drop ranks without full re-init) needs NCCL >= 2.27.
  bool supports_shrink = false;
};

// On success: NCCL is linked and at least one CUDA device is usable.
// Errors: Unimplemented when built without NCCL; FailedPrecondition naming the
// CUDA error when no device (or no driver) is available. Never crashes or
// hangs on a host without a GPU.
OMNI_EXPORT absl::StatusOr<NcclRuntimeInfo> ProbeNccl();

// The NCCL library version without touching any device (0 when not built).
OMNI_EXPORT int NcclLibraryVersion();

}  // namespace omni
