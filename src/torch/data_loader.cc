#include "omni/torch/data_loader.h"

#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace omni::torch_ext {

void LoaderPosition::Consumed() {
  if (handed_out_.empty()) return;  // nothing handed out: misuse, ignored
  consumed_ += static_cast<int64_t>(handed_out_.front());
  handed_out_.pop_front();
}

void LoaderPosition::StartEpoch(std::string epoch_start, int64_t epoch, int64_t consumed) {
  epoch_start_ = std::move(epoch_start);
  epoch_ = epoch;
  consumed_ = consumed;
  handed_out_.clear();
}

absl::Status LoaderPosition::Save(omni::StateWriter& writer) const {
  if (auto st = writer.PutBytes("epoch_start", epoch_start_); !st.ok()) return st;
  const nlohmann::json j = {{"version", 1}, {"epoch", epoch_}, {"consumed", consumed_}};
  return writer.PutBytes("position", j.dump());
}

absl::Status LoaderPosition::Load(const omni::StateReader& reader) {
  absl::StatusOr<std::string> start = reader.ReadBytes("epoch_start");
  if (!start.ok()) return start.status();
  absl::StatusOr<std::string> pos = reader.ReadBytes("position");
  if (!pos.ok()) return pos.status();
  const nlohmann::json j = nlohmann::json::parse(*pos, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("epoch") || !j["epoch"].is_number_integer() ||
      !j.contains("consumed") || !j["consumed"].is_number_integer() || j["consumed"] < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("loader position: key \"position\" is malformed: ", *pos));
  }
  if (start->empty()) {  // saved before the first epoch began: nothing to restore
    restore_.reset();
    return absl::OkStatus();
  }
  restore_ = Restore{*std::move(start), j["epoch"].get<int64_t>(), j["consumed"].get<int64_t>()};
  return absl::OkStatus();
}

}  // namespace omni::torch_ext
