// Errors the LibTorch way: a LibTorch trainer reports errors as exceptions
// (c10::Error from TORCH_CHECK), so these turn an omni Status into one, for
// code that would otherwise carry absl::Status through every line.
//
//   auto rt = omni::torch_ext::Check(omni::Runtime::Create(options));
//   omni::torch_ext::Check(rt->BeginStep());
//
// Thread safety: pure functions.
#pragma once

#include <torch/torch.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace omni::torch_ext {

// Throws c10::Error carrying st.ToString() when `st` is not OK.
inline void Check(const absl::Status& st) { TORCH_CHECK(st.ok(), st.ToString()); }

// The value of `v`; throws c10::Error carrying the status when it has none.
template <typename T>
T Check(absl::StatusOr<T> v) {
  TORCH_CHECK(v.ok(), v.status().ToString());
  return *std::move(v);
}

}  // namespace omni::torch_ext
