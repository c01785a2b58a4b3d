#include "omni/torch/grad_sync.h"

#include <torch/cuda.h>

#include <cstddef>
#include <vector>

#include "absl/strings/str_cat.h"
#include "omni/elastic.h"

namespace omni::torch_ext {
namespace {

absl::StatusOr<DType> CommType(c10::ScalarType t, size_t index) {
  if (t == torch::kFloat) return DType::kF32;
  if (t == torch::kDouble) return DType::kF64;
  return absl::InvalidArgumentError(absl::StrCat("AllReduceGradients: parameter ", index,
                                                 " has a gradient of ", c10::toString(t),
                                                 "; float32 and float64 are supported"));
}

// Reduces one bucket of gradients of one dtype on one device, in place.
// `on_device`: the communicator takes CUDA memory (nccl), so CUDA gradients
// are reduced where they live; otherwise (gloo) they go through host memory.
absl::Status ReduceBucket(Runtime& rt, const std::vector<torch::Tensor>& grads, DType type,
                          bool average, bool on_device) {
  const torch::Tensor& first = grads.front();
  const bool cuda = first.is_cuda();
  const bool in_place = first.is_cpu() || (cuda && on_device);
  const double scale = average ? 1.0 / rt.size() : 1.0;
  // NCCL runs on the communicator's own stream: what LibTorch queued on the
  // device (the backward pass, the packing below) must be done first.
  const auto device_ready = [&] {
    if (cuda && on_device) torch::cuda::synchronize(first.device().index());
  };
  if (grads.size() == 1 && in_place && first.is_contiguous()) {
    device_ready();
    if (auto st = rt.AllReduce(first.data_ptr(), static_cast<size_t>(first.numel()), type,
                               ReduceOp::kSum);
        !st.ok()) {
      return st;
    }
    if (average) first.mul_(scale);
    return absl::OkStatus();
  }
  // Packed into one buffer: on the device with nccl, else on the host.
  std::vector<torch::Tensor> flat;
  flat.reserve(grads.size());
  for (const torch::Tensor& g : grads) {
    flat.push_back(in_place ? g.reshape({-1}) : g.reshape({-1}).to(torch::kCPU));
  }
  torch::Tensor buf = torch::cat(flat);
  device_ready();
  if (auto st =
          rt.AllReduce(buf.data_ptr(), static_cast<size_t>(buf.numel()), type, ReduceOp::kSum);
      !st.ok()) {
    return st;
  }
  if (average) buf.mul_(scale);
  int64_t at = 0;
  for (const torch::Tensor& g : grads) {
    g.copy_(buf.narrow(0, at, g.numel()).view(g.sizes()));
    at += g.numel();
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AllReduceGradients(Runtime& rt, const std::vector<torch::Tensor>& params,
                                const GradSyncOptions& options) {
  if (rt.group() == nullptr) return absl::OkStatus();
  const bool on_device = rt.group()->backend() == "nccl";
  std::vector<torch::Tensor> bucket;
  DType bucket_type = DType::kF32;
  size_t bucket_bytes = 0;
  const auto flush = [&]() -> absl::Status {
    if (bucket.empty()) return absl::OkStatus();
    absl::Status st = ReduceBucket(rt, bucket, bucket_type, options.average, on_device);
    bucket.clear();
    bucket_bytes = 0;
    return st;
  };
  // Which parameters have a gradient on any replica: those that have none
  // anywhere keep none (the optimizer skips them, as in a single process);
  // the others get zeros where they have none.
  std::vector<float> has_grad(params.size());
  for (size_t i = 0; i < params.size(); ++i) has_grad[i] = params[i].grad().defined() ? 1 : 0;
  if (!has_grad.empty()) {
    if (auto st = rt.AllReduce(has_grad.data(), has_grad.size(), DType::kF32, ReduceOp::kSum);
        !st.ok()) {
      return st;
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const torch::Tensor& p = params[i];
    if (has_grad[i] == 0) continue;
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    const torch::Tensor& g = p.grad();
    absl::StatusOr<DType> type = CommType(g.scalar_type(), i);
    if (!type.ok()) return type.status();
    const size_t bytes = g.nbytes();
    if (!bucket.empty() && (*type != bucket_type || bucket_bytes + bytes > options.bucket_bytes ||
                            g.device() != bucket.front().device())) {
      if (auto st = flush(); !st.ok()) return st;
    }
    bucket_type = *type;
    bucket.push_back(g);
    bucket_bytes += bytes;
  }
  return flush();
}

}  // namespace omni::torch_ext
