// TelemetryOptions for unit tests on a fake clock.
#pragma once

#include "omni/telemetry.h"

namespace omni::testing {

// No warm-up, a forecast published after every step, a 1 s horizon.
inline TelemetryOptions FastTelemetryOptions() {
  TelemetryOptions o;
  o.stats.warmup.max_steps = 0;
  o.stats.warmup.min_steps = 0;
  o.publish_interval_ns = 0;
  o.forecast.horizon_ns = 1'000'000'000;
  return o;
}

}  // namespace omni::testing
