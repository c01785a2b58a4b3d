// LibTorch helpers (target omni::torch). The only Omni headers that include
// LibTorch live under omni/torch/.
//
// Thread safety: functions only read the module; do not mutate it concurrently.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "omni/torch/export.h"

namespace omni::torch_ext {

// XXH3-64 over the raw bytes of every parameter of `module`, in
// named_parameters() order (recursive, a fixed order for a given model
// definition), each made contiguous on the CPU first. Two runs whose
// parameters are bit-identical have the same digest. InvalidArgument when a
// parameter is undefined.
OMNI_TORCH_EXPORT absl::StatusOr<uint64_t> ParamsXxh3(const torch::nn::Module& module);

}  // namespace omni::torch_ext
