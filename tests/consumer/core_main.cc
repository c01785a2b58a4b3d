// Uses the installed omni::core: hooks on a fake clock, a forecast.
#include <cstdio>

#include "omni/telemetry.h"
#include "omni/version.h"

int main() {
  omni::FakeClock clock;
  omni::TelemetryOptions o;
  o.stats.warmup.min_steps = 0;
  o.stats.warmup.max_steps = 0;
  o.publish_interval_ns = 0;
  auto tel = omni::Telemetry::Create(o, &clock);
  if (!tel.ok()) return 1;
  for (int i = 0; i < 5; ++i) {
    omni::StepScope step(**tel);
    {
      omni::PhaseScope p(**tel, omni::phase::kDataWait);
      clock.Advance(std::chrono::milliseconds(20));
    }
    omni::PhaseScope p(**tel, omni::phase::kCompute);
    clock.Advance(std::chrono::milliseconds(80));
  }
  if (!(*tel)->Flush().ok()) return 1;
  auto f = (*tel)->LatestForecast();
  if (!f.ok() || f->windows.empty()) return 1;
  std::printf("consumer ok: %s, %zu windows\n", omni::BuildInfo().c_str(), f->windows.size());
  return (*tel)->Close().ok() ? 0 : 1;
}
