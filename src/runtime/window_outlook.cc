// The host's outlook (omni/window_channel.h): from a forecast to the next
// window of each idle kind and the windows a live notice can be matched to,
// the time before which a guest of some kinds can expect no window, and the
// outlook's JSON form (the store key).
#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "json_read.h"
#include "omni/window_channel.h"
#include "quantile.h"

namespace omni {

using nlohmann::json;

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

namespace {

// The forecast's windows a live notice can be matched to (OutlookOf).
void AddClaims(const Forecast& forecast, const PhaseCatalog& catalog, WindowOutlook& o) {
  const std::vector<IdleWindow>& ws = forecast.windows;
  // The forecast lists its windows step by step: each run [i, end) of one
  // step is checked for kinds with windows in several phases.
  for (size_t i = 0, end = 0; i < ws.size() && o.num_claims < kMaxForecastClaims; i = end) {
    for (end = i + 1; end < ws.size() && ws[end].step == ws[i].step;) ++end;
    for (size_t a = i; a < end && o.num_claims < kMaxForecastClaims; ++a) {
      const IdleWindow& w = ws[a];
      if (w.before_step) {  // the gap before the step: its own notices
        if (w.guaranteed_ns > 0) {
          o.claims[static_cast<size_t>(o.num_claims++)] =
              ForecastClaim{w.step, w.guaranteed_ns, kBetweenStepsPhase, IdleKind::kHostSide, 0};
        }
        continue;
      }
      // The last ordinal may stand for a later window (IdleWindow::ordinal).
      if (w.guaranteed_ns <= 0 || w.kind == IdleKind::kNone || w.phase.empty() ||
          w.ordinal >= kMaxIdleOrdinals - 1) {
        continue;
      }
      bool one_phase = true;
      for (size_t b = i; b < end; ++b) {
        one_phase &= ws[b].before_step || ws[b].kind != w.kind || ws[b].phase == w.phase;
      }
      const absl::StatusOr<PhaseId> phase = catalog.Find(w.phase);
      if (!one_phase || !phase.ok() || catalog.idle_kind(*phase) != w.kind) continue;
      o.claims[static_cast<size_t>(o.num_claims++)] =
          ForecastClaim{w.step, w.guaranteed_ns, *phase, w.kind, w.ordinal};
    }
  }
}

}  // namespace

WindowOutlook OutlookOf(const Forecast& forecast, int max_windows,
                        const std::array<int64_t, kNumIdleKinds>& last_seen_step,
                        const PhaseCatalog* catalog) {
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
  if (catalog != nullptr) AddClaims(forecast, *catalog, o);
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

int64_t WindowOutlook::GuaranteedFor(int64_t step, PhaseId phase, IdleKind kind,
                                     int ordinal) const {
  if (state != OutlookState::kForecast) return 0;
  const ForecastClaim* first = claims.data();
  return ClaimFor(first, first + std::clamp(num_claims, 0, kMaxForecastClaims), step, phase, kind,
                  ordinal);
}

WindowOutlook WindowOutlook::ShiftedBy(int64_t delta_ns) const {
  WindowOutlook o = *this;
  const auto shift = [delta_ns](int64_t& t) {
    if (t != 0) t += delta_ns;
  };
  for (int64_t* t : {&o.made_at_ns, &o.covered_until_ns, &o.busy_until_ns, &o.busy_announced_ns,
                     &o.published_ns}) {
    shift(*t);
  }
  for (NextIdleWindow& n : o.next) {
    if (n.outlook != KindOutlook::kNext) continue;
    shift(n.earliest_start_ns);
    shift(n.latest_start_ns);
  }
  return o;
}

std::string WindowOutlookToJson(const WindowOutlook& o) {
  json kinds = json::object();
  for (size_t k = 1; k < o.next.size(); ++k) {
    const NextIdleWindow& n = o.next[k];
    kinds[IdleKindName(static_cast<IdleKind>(k))] = {{"outlook", KindOutlookName(n.outlook)},
                                                     {"windows", n.windows},
                                                     {"earliest_start_ns", n.earliest_start_ns},
                                                     {"latest_start_ns", n.latest_start_ns},
                                                     {"guaranteed_ns", n.guaranteed_ns},
                                                     {"expected_ns", n.expected_ns},
                                                     {"step", n.step},
                                                     {"last_seen_step", n.last_seen_step}};
  }
  // The gaps between steps' claims apart ("gap_claims", added within version
  // 2): a reader that knows only the catalog's phases ignores them.
  json claims = json::array(), gap_claims = json::array();
  for (int i = 0; i < std::min(o.num_claims, kMaxForecastClaims); ++i) {
    const ForecastClaim& c = o.claims[static_cast<size_t>(i)];
    if (c.phase == kBetweenStepsPhase) {
      gap_claims.push_back({{"step", c.step}, {"guaranteed_ns", c.guaranteed_ns}});
      continue;
    }
    claims.push_back({{"step", c.step},
                      {"phase", c.phase},
                      {"kind", IdleKindName(c.kind)},
                      {"ordinal", c.ordinal},
                      {"guaranteed_ns", c.guaranteed_ns}});
  }
  json j;
  j["schema"] = "omni.outlook";
  j["version"] = 2;
  j["clock"] = "CLOCK_MONOTONIC";
  j["sequence"] = o.sequence;
  j["state"] = OutlookStateName(o.state);
  j["published_ns"] = o.published_ns;
  j["made_at_ns"] = o.made_at_ns;
  j["horizon_ns"] = o.horizon_ns;
  j["covered_until_ns"] = o.covered_until_ns;
  j["confidence"] = o.confidence;
  j["last_step"] = o.last_step;
  j["busy_until_ns"] = o.busy_until_ns;
  j["busy_announced_ns"] = o.busy_announced_ns;
  j["writer_closed"] = o.writer_closed;
  j["kinds"] = std::move(kinds);
  j["claims"] = std::move(claims);
  if (!gap_claims.empty()) j["gap_claims"] = std::move(gap_claims);
  return j.dump();
}

namespace {

// The integer field `key` of `j`; InvalidArgument naming `where`.`key`.
absl::Status ReadInt(const json& j, const char* key, const std::string& where, int64_t& out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat("window outlook: field '", where, key, "' missing or not an integer"));
  }
  out = it->get<int64_t>();
  return absl::OkStatus();
}

// The string field `key` of `j`, or "" when it is missing or not a string
// (json::value would throw on another type).
std::string StringOr(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// Version 2's "claims": the forecast windows a notice can be matched to
// (at most kMaxForecastClaims; claims of a kind this version does not know
// are skipped).
absl::Status ReadClaims(const json& j, WindowOutlook& o) {
  auto claims = j.find("claims");
  if (claims == j.end() || !claims->is_array()) {
    return absl::InvalidArgumentError("window outlook: field 'claims' missing or not an array");
  }
  if (claims->size() > static_cast<size_t>(kMaxForecastClaims)) {
    return absl::InvalidArgumentError(absl::StrCat("window outlook: field 'claims' has ",
                                                   claims->size(), " entries (at most ",
                                                   kMaxForecastClaims, ")"));
  }
  for (size_t i = 0; i < claims->size(); ++i) {
    const json& v = (*claims)[i];
    const std::string where = absl::StrCat("claims[", i, "].");
    if (!v.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("window outlook: field 'claims[", i, "]' is not an object"));
    }
    int64_t step = 0, phase = 0, ordinal = 0, guaranteed = 0;
    for (auto [key, out] : {std::pair<const char*, int64_t*>{"step", &step},
                            {"phase", &phase},
                            {"ordinal", &ordinal},
                            {"guaranteed_ns", &guaranteed}}) {
      if (auto st = ReadInt(v, key, where, *out); !st.ok()) return st;
    }
    if (phase < 0 || phase >= kMaxPhases || ordinal < 0 || ordinal > 0xffff || guaranteed < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "window outlook: field '", where,
          phase < 0 || phase >= kMaxPhases
              ? "phase' is not a phase id"
              : (guaranteed < 0 ? "guaranteed_ns' is negative" : "ordinal' is out of range")));
    }
    absl::StatusOr<IdleKind> kind = ParseIdleKind(StringOr(v, "kind"));
    if (!kind.ok() || *kind == IdleKind::kNone) continue;  // a newer writer's kind
    o.claims[static_cast<size_t>(o.num_claims++)] = ForecastClaim{
        step, guaranteed, static_cast<PhaseId>(phase), *kind, static_cast<int>(ordinal)};
  }
  // The gaps between steps' claims (optional): after the others.
  auto gaps = j.find("gap_claims");
  if (gaps == j.end()) return absl::OkStatus();
  if (!gaps->is_array()) {
    return absl::InvalidArgumentError("window outlook: field 'gap_claims' is not an array");
  }
  if (static_cast<size_t>(o.num_claims) + gaps->size() > static_cast<size_t>(kMaxForecastClaims)) {
    return absl::InvalidArgumentError(
        absl::StrCat("window outlook: fields 'claims' and 'gap_claims' have ",
                     claims->size() + gaps->size(), " entries (at most ", kMaxForecastClaims, ")"));
  }
  for (size_t i = 0; i < gaps->size(); ++i) {
    const json& v = (*gaps)[i];
    const std::string where = absl::StrCat("gap_claims[", i, "].");
    if (!v.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("window outlook: field 'gap_claims[", i, "]' is not an object"));
    }
    int64_t step = 0, guaranteed = 0;
    if (auto st = ReadInt(v, "step", where, step); !st.ok()) return st;
    if (auto st = ReadInt(v, "guaranteed_ns", where, guaranteed); !st.ok()) return st;
    if (guaranteed < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("window outlook: field '", where, "guaranteed_ns' is negative"));
    }
    o.claims[static_cast<size_t>(o.num_claims++)] =
        ForecastClaim{step, guaranteed, kBetweenStepsPhase, IdleKind::kHostSide, 0};
  }
  return absl::OkStatus();
}

absl::StatusOr<WindowOutlook> ParseWindowOutlook(const std::string& text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("window outlook: not a JSON object");
  }
  if (StringOr(j, "schema") != "omni.outlook") {
    return absl::FailedPreconditionError("window outlook: schema is not 'omni.outlook'");
  }
  int64_t version = 0;
  if (auto st = ReadInt(j, "version", "", version); !st.ok()) return st;
  if (version != 1 && version != 2) {
    return absl::FailedPreconditionError(
        absl::StrCat("window outlook: version ", version, "; this reader reads versions 1 and 2"));
  }
  WindowOutlook o;
  int64_t seq = 0;
  for (auto [key, out] : {std::pair<const char*, int64_t*>{"sequence", &seq},
                          {"published_ns", &o.published_ns},
                          {"made_at_ns", &o.made_at_ns},
                          {"horizon_ns", &o.horizon_ns},
                          {"covered_until_ns", &o.covered_until_ns},
                          {"last_step", &o.last_step},
                          {"busy_until_ns", &o.busy_until_ns},
                          {"busy_announced_ns", &o.busy_announced_ns}}) {
    if (auto st = ReadInt(j, key, "", *out); !st.ok()) return st;
  }
  if (seq < 0 || o.horizon_ns < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "window outlook: field '", seq < 0 ? "sequence" : "horizon_ns", "' is negative"));
  }
  o.sequence = static_cast<uint64_t>(seq);
  auto conf = j.find("confidence");
  if (conf == j.end() || !conf->is_number() || !(conf->get<double>() >= 0) ||
      conf->get<double>() >= 1) {
    return absl::InvalidArgumentError(
        "window outlook: field 'confidence' missing or not a number in [0, 1)");
  }
  o.confidence = conf->get<double>();
  auto closed = j.find("writer_closed");
  if (closed == j.end() || !closed->is_boolean()) {
    return absl::InvalidArgumentError(
        "window outlook: field 'writer_closed' missing or not a boolean");
  }
  o.writer_closed = closed->get<bool>();
  const std::string state = StringOr(j, "state");
  if (state == "forecast") {
    o.state = OutlookState::kForecast;
  } else if (state == "withdrawn") {
    o.state = OutlookState::kWithdrawn;
  } else if (state == "none") {
    o.state = OutlookState::kNone;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("window outlook: field 'state' is '", state,
                                                   "' (forecast, withdrawn or none)"));
  }
  auto kinds = j.find("kinds");
  if (kinds == j.end() || !kinds->is_object()) {
    return absl::InvalidArgumentError("window outlook: field 'kinds' missing or not an object");
  }
  for (const auto& [name, v] : kinds->items()) {
    absl::StatusOr<IdleKind> kind = ParseIdleKind(name);
    if (!kind.ok() || *kind == IdleKind::kNone) continue;  // a newer writer's kind
    const std::string where = absl::StrCat("kinds.", name, ".");
    if (!v.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("window outlook: field 'kinds.", name, "' is not an object"));
    }
    NextIdleWindow& n = o.next[static_cast<size_t>(*kind)];
    for (auto [key, out] : {std::pair<const char*, int64_t*>{"windows", &n.windows},
                            {"earliest_start_ns", &n.earliest_start_ns},
                            {"latest_start_ns", &n.latest_start_ns},
                            {"guaranteed_ns", &n.guaranteed_ns},
                            {"expected_ns", &n.expected_ns},
                            {"step", &n.step},
                            {"last_seen_step", &n.last_seen_step}}) {
      if (auto st = ReadInt(v, key, where, *out); !st.ok()) return st;
    }
    if (n.windows < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("window outlook: field '", where, "windows' is negative"));
    }
    const std::string outlook = StringOr(v, "outlook");
    if (outlook == "next") {
      n.outlook = KindOutlook::kNext;
    } else if (outlook == "none") {
      n.outlook = KindOutlook::kNone;
    } else if (outlook == "unknown") {
      n.outlook = KindOutlook::kUnknown;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "window outlook: field '", where, "outlook' is '", outlook, "' (next, none or unknown)"));
    }
  }
  if (version >= 2) {
    if (auto st = ReadClaims(j, o); !st.ok()) return st;
  }
  return o;
}

}  // namespace

absl::StatusOr<WindowOutlook> WindowOutlookFromJson(const std::string& text) {
  return internal::CatchJsonErrors<WindowOutlook>("window outlook",
                                                  [&] { return ParseWindowOutlook(text); });
}

}  // namespace omni
