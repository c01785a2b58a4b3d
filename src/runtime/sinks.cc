#include "omni/sinks.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fs.h"

namespace omni {
namespace {

class FileSink final : public ForecastSink {
 public:
  explicit FileSink(std::string path) : path_(std::move(path)) {}
  absl::Status Publish(const Forecast& forecast) override {
    return internal::WriteFileAtomic(path_, ForecastToJson(forecast) + "\n");
  }
  std::string Describe() const override { return absl::StrCat("file ", path_); }

 private:
  std::string path_;
};

class CallbackSink final : public ForecastSink {
 public:
  CallbackSink(std::function<absl::Status(const Forecast&)> fn, std::string name)
      : fn_(std::move(fn)), name_(std::move(name)) {}
  absl::Status Publish(const Forecast& forecast) override { return fn_(forecast); }
  std::string Describe() const override { return name_; }

 private:
  std::function<absl::Status(const Forecast&)> fn_;
  std::string name_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ForecastSink>> MakeFileSink(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("forecast file path is empty");
  if (auto st = internal::CheckWritableDir(path); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("forecast sink: ", st.message()));
  }
  return std::make_unique<FileSink>(path);
}

std::unique_ptr<ForecastSink> MakeCallbackSink(std::function<absl::Status(const Forecast&)> fn,
                                               std::string name) {
  return std::make_unique<CallbackSink>(std::move(fn), std::move(name));
}

}  // namespace omni
