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

class StoreSink final : public ForecastSink {
 public:
  StoreSink(Store& store, std::string forecast_key, std::string window_key, std::string outlook_key)
      : store_(store),
        forecast_key_(std::move(forecast_key)),
        window_key_(std::move(window_key)),
        outlook_key_(std::move(outlook_key)) {}
  absl::Status Publish(const Forecast& forecast) override {
    return store_.Set(forecast_key_, ForecastToJson(forecast));
  }
  absl::Status PublishWindow(const WindowNotice& notice) override {
    return store_.Set(window_key_, WindowNoticeToJson(notice));
  }
  absl::Status PublishOutlook(const WindowOutlook& outlook) override {
    return store_.Set(outlook_key_, WindowOutlookToJson(outlook));
  }
  std::string Describe() const override {
    return absl::StrCat("store keys ", forecast_key_, ", ", window_key_, ", ", outlook_key_);
  }

 private:
  Store& store_;
  std::string forecast_key_, window_key_, outlook_key_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ForecastSink>> MakeStoreSink(Store& store,
                                                            const std::string& prefix) {
  std::string forecast_key = absl::StrCat(prefix, "/", kForecastStoreKey);
  std::string window_key = absl::StrCat(prefix, "/", kWindowStoreKey);
  std::string outlook_key = absl::StrCat(prefix, "/", kOutlookStoreKey);
  for (const std::string* key : {&forecast_key, &window_key, &outlook_key}) {
    if (auto st = ValidateStoreKey(*key); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("store sink: ", st.message()));
    }
  }
  return std::make_unique<StoreSink>(store, std::move(forecast_key), std::move(window_key),
                                     std::move(outlook_key));
}

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
