// Data-parallel gradient all-reduce through an omni::Runtime: the gradients
// of the given parameters are summed over the replicas where they live,
// bucketed and in place.
//
//   loss.backward();
//   if (omni::torch_ext::AllReduceGradients(*rt, model->parameters()).ok()) optimizer.step();
//   omni::Decision d = rt->EndStep().value();   // kRedoStep after a failure
//
// Where the gradients live decides the path (ElasticGroup::backend()):
// CPU gradients are reduced in host memory (gloo); CUDA gradients with the
// nccl backend are reduced on their device, in place (the device is
// synchronized first: NCCL runs on its own stream); CUDA gradients with
// gloo are staged through host memory. A bucket that is one contiguous
// float32/float64 gradient is reduced without a copy; smaller gradients are
// packed into buckets of up to bucket_bytes (one collective each, packed on
// the gradients' device) and copied back.
//
// Thread safety: call from the training thread, between BeginStep and
// EndStep; nothing else may touch the gradients meanwhile.
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "omni/runtime.h"
#include "omni/torch/export.h"

namespace omni::torch_ext {

struct GradSyncOptions {
  size_t bucket_bytes = size_t{25} << 20;  // gradients packed per collective
  // Divide by the number of replicas after the sum (a mean over replicas);
  // false keeps the sum (the loss is then scaled by each replica's share).
  bool average = false;
};

// Sums the gradients of `params` over the Runtime's replicas, in place.
// The replicas first agree (one small collective: a float per parameter)
// on which parameters have a gradient anywhere: a parameter without one on
// some replicas counts as zeros there (every replica reduces the same
// layout); a parameter without one on every replica (unused by the step
// everywhere, e.g. an image encoder in a text-only step) keeps none, so the
// optimizer skips it exactly as in a single process (AdamW then applies no
// weight decay to it). Without an elastic group: OK, untouched.
// Errors: InvalidArgument naming the parameter index for a dtype other than
// float32 / float64; a failed collective (latched by the Runtime: skip the
// optimizer step, EndStep answers kRedoStep).
OMNI_TORCH_EXPORT absl::Status AllReduceGradients(Runtime& rt,
                                                  const std::vector<torch::Tensor>& params,
                                                  const GradSyncOptions& options = {});

}  // namespace omni::torch_ext
