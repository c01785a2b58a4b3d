// The host's outlook (omni/window_channel.h): from a forecast to the next
// window of each idle kind, and the time before which a guest of some kinds
// can expect no window.
#include <algorithm>
#include <limits>

#include "omni/window_channel.h"

namespace omni {

const char* KindOutlookName(KindOutlook o) {
  switch (o) {
    case KindOutlook::kNext:
      return "next";
    case KindOutlook::kNone:
      return "none";
    case KindOutlook::kUnknown:
      break;
  }
  return "unknown";
}

const char* OutlookStateName(OutlookState s) {
  switch (s) {
    case OutlookState::kForecast:
      return "forecast";
    case OutlookState::kWithdrawn:
      return "withdrawn";
    case OutlookState::kNone:
      break;
  }
  return "none";
}

WindowOutlook OutlookOf(const Forecast& forecast, int max_windows,
                        const std::array<int64_t, kNumIdleKinds>& last_seen_step) {
  WindowOutlook o;
  o.made_at_ns = forecast.made_at_ns;
  o.horizon_ns = forecast.horizon_ns;
  o.confidence = forecast.confidence;
  o.last_step = forecast.last_step;
  for (size_t k = 0; k < o.next.size(); ++k) o.next[k].last_seen_step = last_seen_step[k];
  // No window at all: the model suspends windows after a step far outside
  // its bound, so this says nothing about the host's idle time.
  if (forecast.windows.empty()) {
    o.state = OutlookState::kWithdrawn;
    return o;
  }
  o.state = OutlookState::kForecast;
  o.covered_until_ns = forecast.made_at_ns + forecast.horizon_ns;
  if (max_windows > 0 && static_cast<int>(forecast.windows.size()) >= max_windows) {
    // The walk over future steps stopped at the list's limit: later steps'
    // windows are missing. Complete up to the last step it reached.
    int64_t last = std::numeric_limits<int64_t>::min();
    for (const IdleWindow& w : forecast.windows) last = std::max(last, w.step);
    int64_t cut = o.covered_until_ns;
    for (const IdleWindow& w : forecast.windows) {
      if (w.step == last) cut = std::min(cut, w.earliest_start_ns);
    }
    o.covered_until_ns = cut;
  }
  for (const IdleWindow& w : forecast.windows) {
    const auto k = static_cast<size_t>(w.kind);
    if (w.kind == IdleKind::kNone || k >= o.next.size()) continue;
    NextIdleWindow& n = o.next[k];
    if (n.windows++ > 0 && w.earliest_start_ns >= n.earliest_start_ns) continue;
    n.earliest_start_ns = w.earliest_start_ns;
    n.latest_start_ns = w.latest_start_ns;
    n.guaranteed_ns = w.guaranteed_ns;
    n.expected_ns = w.expected_ns;
    n.step = w.step;
  }
  // The model learned from steps (last_step - steps_observed, last_step]: a
  // kind seen there and not listed is one it does not expect (or cannot
  // claim); one not seen there it knows nothing about.
  const int64_t first_learned = forecast.last_step - forecast.steps_observed + 1;
  for (size_t k = 1; k < o.next.size(); ++k) {
    NextIdleWindow& n = o.next[k];
    if (n.windows > 0) {
      n.outlook = KindOutlook::kNext;
    } else if (n.last_seen_step >= 0 && n.last_seen_step >= first_learned) {
      n.outlook = KindOutlook::kNone;
    }
  }
  return o;
}

int64_t WindowOutlook::NoWindowBeforeNs(uint32_t kinds) const {
  int64_t from_forecast = 0;
  if (state == OutlookState::kForecast) {
    int64_t earliest = std::numeric_limits<int64_t>::max();
    for (size_t k = 1; k < next.size(); ++k) {
      if ((kinds & (uint32_t{1} << k)) == 0) continue;
      const NextIdleWindow& n = next[k];
      if (n.outlook == KindOutlook::kUnknown) {
        earliest = 0;  // a kind the forecast knows nothing about: no statement
        break;
      }
      earliest = std::min(earliest, n.outlook == KindOutlook::kNext
                                        ? std::min(n.earliest_start_ns, covered_until_ns)
                                        : covered_until_ns);
    }
    if (earliest != std::numeric_limits<int64_t>::max()) from_forecast = earliest;
  }
  return std::max(from_forecast, busy_until_ns);
}

}  // namespace omni
