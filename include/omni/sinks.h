// Where forecasts go: a file replaced atomically (for node agents), a
// callback, and later a store key. A sink is a small class; new ones plug in.
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

namespace omni {

class OMNI_EXPORT ForecastSink {
 public:
  virtual ~ForecastSink() = default;
  // Publishes one forecast. Errors are reported, counted and retried with the
  // next forecast; they never stop training.
  virtual absl::Status Publish(const Forecast& forecast) = 0;
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

}  // namespace omni
