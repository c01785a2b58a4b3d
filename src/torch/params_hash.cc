#include <cstddef>
#include <cstdint>
#include <exception>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "omni/hash.h"
#include "omni/torch/params.h"

namespace omni::torch_ext {

absl::StatusOr<uint64_t> ParamsXxh3(const torch::nn::Module& module) {
  // No exception may cross the API boundary: LibTorch errors become Status.
  try {
    Xxh3 hash;
    for (const auto& item : module.named_parameters(/*recurse=*/true)) {
      const torch::Tensor& param = item.value();
      if (!param.defined()) {
        return absl::InvalidArgumentError(
            absl::StrCat("ParamsXxh3: parameter '", item.key(), "' is undefined"));
      }
      const torch::Tensor bytes = param.detach().contiguous().to(torch::kCPU).contiguous();
      hash.Update(bytes.data_ptr(), static_cast<size_t>(bytes.numel()) * bytes.element_size());
    }
    return hash.Digest();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("ParamsXxh3: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("ParamsXxh3: ", e.what()));
  }
}

}  // namespace omni::torch_ext
