// What the NCCL path can use on this host (omni/nccl.h): ProbeNccl and the
// library version, without touching a device where there is none.
#include "omni/nccl.h"

#include "absl/strings/str_cat.h"

#if OMNI_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace omni {

int NcclLibraryVersion() {
#if OMNI_HAVE_NCCL
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return 0;
  return v;
#else
  return 0;
#endif
}

absl::StatusOr<NcclRuntimeInfo> ProbeNccl() {
#if OMNI_HAVE_NCCL
  NcclRuntimeInfo info;
  info.compiled_version = NCCL_VERSION_CODE;
  info.runtime_version = NcclLibraryVersion();
  info.supports_shrink = info.runtime_version >= 22700;
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    // Clear the sticky error state so later CUDA calls are not poisoned.
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "NCCL ", info.runtime_version,
        " is linked but no CUDA device is usable: cudaGetDeviceCount: ", cudaGetErrorName(err),
        " (", cudaGetErrorString(err), ")"));
  }
  if (n == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("NCCL ", info.runtime_version, " is linked but no CUDA device is visible"));
  }
  info.cuda_devices = n;
  return info;
#else
  return absl::UnimplementedError("omni was built without NCCL (OMNI_HAVE_NCCL=0)");
#endif
}

}  // namespace omni
