#include "omni/clock.h"

#include <ctime>

namespace omni {
namespace {

class SteadyClock final : public Clock {
 public:
  int64_t NowNanos() const override {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  }
};

}  // namespace

const Clock* Clock::Real() {
  static const SteadyClock clock;
  return &clock;
}

}  // namespace omni
