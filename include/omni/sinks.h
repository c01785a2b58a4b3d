// Where forecasts and window notices go: a file replaced atomically (for node
// agents), a callback, and store keys for readers on other hosts. A sink is a
// small class; new ones plug in.
//
// Thread safety: Telemetry calls a sink from its worker thread only; a sink
// used elsewhere must be called from one thread at a time.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "omni/export.h"
#include "omni/forecast.h"
#include "omni/store.h"
#include "omni/window_channel.h"

namespace omni {

class OMNI_EXPORT ForecastSink {
 public:
  virtual ~ForecastSink() = default;
  // Publishes one forecast. Errors are reported, counted and retried with the
  // next forecast; they never stop training.
  virtual absl::Status Publish(const Forecast& forecast) = 0;
  // Publishes one window notice ("idle now" / "busy again"), a few
  // milliseconds after the hooks wrote it. Optional: the default ignores it.
  virtual absl::Status PublishWindow(const WindowNotice& notice) {
    (void)notice;
    return absl::OkStatus();
  }
  // Publishes the host's outlook (omni/window_channel.h) each time it changes
  // (a forecast, a withdrawal, Telemetry::AnnounceBusy), with published_ns
  // set. Optional: the default ignores it.
  virtual absl::Status PublishOutlook(const WindowOutlook& outlook) {
    (void)outlook;
    return absl::OkStatus();
  }
  virtual std::string Describe() const = 0;
};

// Writes ForecastToJson to `path` through a temporary file in the same
// directory, fsync, rename: readers see the old or the new forecast, never a
// partial one. Create fails (naming the path and the OS error) when the
// directory does not exist or is not writable.
OMNI_EXPORT absl::StatusOr<std::unique_ptr<ForecastSink>> MakeFileSink(const std::string& path);

// Calls `fn` with each forecast; its Status is the publish result.
OMNI_EXPORT std::unique_ptr<ForecastSink> MakeCallbackSink(
    std::function<absl::Status(const Forecast&)> fn, std::string name = "callback");

// Keys a store sink writes under its prefix (docs/telemetry.md).
inline constexpr const char* kForecastStoreKey = "forecast";  // ForecastToJson
inline constexpr const char* kWindowStoreKey = "window";      // WindowNoticeToJson
inline constexpr const char* kOutlookStoreKey = "outlook";    // WindowOutlookToJson
inline constexpr const char* kDefaultStorePrefix = "omni/telemetry";

// For readers on other hosts: Set(<prefix>/forecast, ForecastToJson) for each
// forecast, Set(<prefix>/window, WindowNoticeToJson) for each window notice
// (its times are on the writer host's clock; elapsed_ns and remaining_ns are
// as of the publication, read_at_ns) and Set(<prefix>/outlook,
// WindowOutlookToJson) for each outlook (published_ns says when). A guest on
// another host reads them with colocate::StoreWindowSource
// (omni/colocate_store.h). Does not own `store`, which must
// outlive the sink. InvalidArgument naming the key when the prefix does not
// make valid store keys (see omni/store.h).
OMNI_EXPORT absl::StatusOr<std::unique_ptr<ForecastSink>> MakeStoreSink(
    Store& store, const std::string& prefix = kDefaultStorePrefix);

}  // namespace omni
