// Reading JSON that anybody may have written (files, store values):
// nlohmann's accessors throw on a field of another JSON type than the one
// asked for, and the readers' API promises a Status. Private to omni_core.
//
// Thread safety: a plain function.
#pragma once

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace omni::internal {

// parse(), with a json::exception turned into InvalidArgument
// "<what>: <the exception's message>".
template <typename T, typename F>
absl::StatusOr<T> CatchJsonErrors(const char* what, const F& parse) {
  try {
    return parse();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", e.what()));
  }
}

}  // namespace omni::internal
