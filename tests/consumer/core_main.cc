// Uses omni::core through find_package(omni): hooks on a fake clock, a
// forecast, and a few steps through the Runtime.
#include <cstdio>

#include "omni/runtime.h"
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
  if (!(*tel)->Close().ok()) return 1;

  omni::RuntimeOptions ro;
  ro.clock = &clock;
  ro.handle_preemption = false;
  auto rt = omni::Runtime::Create(ro);
  if (!rt.ok()) return 1;
  int64_t counter = 0;
  omni::BytesState state("value", &counter, sizeof(counter));
  if (!(*rt)->Register("counter", &state).ok() || !(*rt)->Start().ok()) return 1;
  for (int i = 0; i < 3; ++i) {
    if (!(*rt)->BeginStep().ok()) return 1;
    ++counter;
    auto d = (*rt)->EndStep();
    if (!d.ok() || d->kind != omni::Decision::kContinue) return 1;
  }
  if ((*rt)->step() != 3 || !(*rt)->Finish().ok()) return 1;
  std::printf("consumer ok: %s, %zu windows, %lld runtime steps\n", omni::BuildInfo().c_str(),
              f->windows.size(), static_cast<long long>((*rt)->step()));
  return 0;
}
