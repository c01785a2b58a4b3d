// Helpers for building step records in tests.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "omni/phase.h"

namespace omni::testing {

struct SpanSpec {
  PhaseId phase;
  int64_t start_ms;  // relative to the step start
  int64_t end_ms;
  int depth = 0;
};

inline constexpr int64_t kMs = 1'000'000;

// A step starting at `start_ms` (absolute), lasting `dur_ms`, with spans.
inline StepRecord MakeStep(int64_t step, int64_t start_ms, int64_t dur_ms,
                           std::initializer_list<SpanSpec> spans) {
  StepRecord r;
  r.step = step;
  r.start_ns = start_ms * kMs;
  r.end_ns = (start_ms + dur_ms) * kMs;
  for (const SpanSpec& s : spans) {
    PhaseSpan& p = r.spans[r.num_spans++];
    p.phase = s.phase;
    p.start_ns = r.start_ns + s.start_ms * kMs;
    p.end_ns = r.start_ns + s.end_ms * kMs;
    p.depth = static_cast<uint8_t>(s.depth);
  }
  return r;
}

// `r` moved `ns` later, its spans with it (a clock reading in ns that
// MakeStep's milliseconds do not reach: a pause of 2^60 ns, a log ending
// at kMaxClockNs).
inline StepRecord ShiftedBy(StepRecord r, int64_t ns) {
  r.start_ns += ns;
  r.end_ns += ns;
  for (int i = 0; i < r.num_spans; ++i) {
    r.spans[i].start_ns += ns;
    r.spans[i].end_ns += ns;
  }
  return r;
}

}  // namespace omni::testing
