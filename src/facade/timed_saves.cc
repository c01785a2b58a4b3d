#include "facade/timed_saves.h"

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace omni::internal {

absl::StatusOr<bool> SaveAgreement::AtBoundary(int64_t step, bool due) {
  const std::string key = std::to_string(index_);
  if (agreed_ < 0) {
    absl::StatusOr<std::optional<std::string>> v = store_.TryGet(key);
    if (!v.ok()) return v.status();
    if (!v->has_value() && due) {
      absl::StatusOr<std::string> won = store_.CompareAndSet(key, "", std::to_string(step + 1));
      if (!won.ok()) return won.status();
      *v = *won;
    }
    if (!v->has_value()) return false;
    if (!absl::SimpleAtoi(**v, &agreed_) || agreed_ < 0) {
      agreed_ = -1;
      return absl::InvalidArgumentError(absl::StrCat(
          "store key '", key, "' of the timed checkpoints holds a malformed step: '", **v, "'"));
    }
  }
  if (step < agreed_) return false;
  if (step > agreed_) {
    return absl::InternalError(absl::StrCat("rank is at the boundary after step ", step,
                                            ", past the timed checkpoint agreed after step ",
                                            agreed_, ": the ranks are not in lockstep"));
  }
  agreed_ = -1;
  ++index_;
  return true;
}

}  // namespace omni::internal
