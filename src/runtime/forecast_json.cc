#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "json_read.h"
#include "omni/forecast.h"

namespace omni {

using nlohmann::json;

namespace {
double Ms(double ns) { return std::round(ns / 1e3) / 1e3; }  // ms, microsecond resolution
}  // namespace

std::string ForecastToJson(const Forecast& f) {
  json j;
  j["schema"] = "omni.forecast";
  j["version"] = Forecast::kSchemaVersion;
  j["clock"] = "CLOCK_MONOTONIC";
  j["made_at_ns"] = f.made_at_ns;
  j["horizon_ns"] = f.horizon_ns;
  j["last_step"] = f.last_step;
  j["steps_observed"] = f.steps_observed;
  j["k"] = f.k;
  j["confidence"] = std::round(f.confidence * 1e4) / 1e4;
  j["devices_needed_at_ns"] = f.devices_needed_at_ns;
  j["devices_needed_in_ms"] = Ms(static_cast<double>(f.devices_needed_at_ns - f.made_at_ns));
  j["total_idle_ms"] = Ms(static_cast<double>(f.total_idle_ns()));
  json ws = json::array();
  for (const IdleWindow& w : f.windows) {
    ws.push_back({{"start_ns", w.start_ns},
                  {"duration_ns", w.duration_ns},
                  {"start_in_ms", Ms(static_cast<double>(w.start_ns - f.made_at_ns))},
                  {"duration_ms", Ms(static_cast<double>(w.duration_ns))},
                  {"kind", std::string(IdleKindName(w.kind))},
                  {"confidence", std::round(w.confidence * 1e4) / 1e4},
                  {"step", w.step},
                  {"phase", w.phase},
                  {"earliest_start_ns", w.earliest_start_ns},
                  {"latest_start_ns", w.latest_start_ns},
                  {"guaranteed_ns", w.guaranteed_ns},
                  {"expected_ns", w.expected_ns},
                  {"ordinal", w.ordinal},
                  {"guaranteed_ms", Ms(static_cast<double>(w.guaranteed_ns))},
                  {"expected_ms", Ms(static_cast<double>(w.expected_ns))}});
    if (w.before_step) ws.back()["before_step"] = true;
  }
  j["windows"] = std::move(ws);
  json bs = json::array();
  for (const StepBound& b : f.next_steps) {
    bs.push_back({{"step", b.step},
                  {"lo_ns", b.lo_ns},
                  {"hi_ns", b.hi_ns},
                  {"confidence", std::round(b.confidence * 1e4) / 1e4}});
    if (b.gap_hi_ns > 0) bs.back()["gap_hi_ns"] = b.gap_hi_ns;
  }
  j["next_steps"] = std::move(bs);
  j["save_hi_ns"] = f.save_hi_ns;
  return j.dump();
}

namespace {

absl::StatusOr<Forecast> ParseForecast(const std::string& text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("forecast: not a JSON object");
  }
  if (j.value("schema", "") != "omni.forecast") {
    return absl::InvalidArgumentError("forecast: schema is not 'omni.forecast'");
  }
  const auto need_int = [&](const json& o, const char* key) -> absl::StatusOr<int64_t> {
    auto it = o.find(key);
    if (it == o.end() || !it->is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat("forecast: field '", key, "' missing or not an integer"));
    }
    return it->get<int64_t>();
  };
  auto version = need_int(j, "version");
  if (!version.ok()) return version.status();
  if (*version > Forecast::kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat("forecast: schema version ", *version,
                                                      " is newer than supported version ",
                                                      Forecast::kSchemaVersion));
  }
  Forecast f;
  for (auto [key, dst] : {std::pair<const char*, int64_t*>{"made_at_ns", &f.made_at_ns},
                          {"horizon_ns", &f.horizon_ns},
                          {"last_step", &f.last_step},
                          {"steps_observed", &f.steps_observed},
                          {"devices_needed_at_ns", &f.devices_needed_at_ns}}) {
    auto v = need_int(j, key);
    if (!v.ok()) return v.status();
    *dst = *v;
  }
  f.k = j.value("k", 0.0);
  f.confidence = j.value("confidence", 0.0);
  f.save_hi_ns = j.value("save_hi_ns", int64_t{0});
  if (auto bs = j.find("next_steps"); bs != j.end()) {
    if (!bs->is_array()) {
      return absl::InvalidArgumentError("forecast: field 'next_steps' is not an array");
    }
    for (const json& b : *bs) {
      StepBound sb;
      for (auto [key, dst] : {std::pair<const char*, int64_t*>{"step", &sb.step},
                              {"lo_ns", &sb.lo_ns},
                              {"hi_ns", &sb.hi_ns}}) {
        auto v = need_int(b, key);
        if (!v.ok()) return v.status();
        *dst = *v;
      }
      sb.confidence = b.value("confidence", 0.0);
      sb.gap_hi_ns = b.value("gap_hi_ns", int64_t{0});
      f.next_steps.push_back(sb);
    }
  }
  auto ws = j.find("windows");
  if (ws == j.end() || !ws->is_array()) {
    return absl::InvalidArgumentError("forecast: field 'windows' missing or not an array");
  }
  for (const json& w : *ws) {
    IdleWindow iw;
    for (auto [key, dst] : {std::pair<const char*, int64_t*>{"start_ns", &iw.start_ns},
                            {"duration_ns", &iw.duration_ns},
                            {"step", &iw.step}}) {
      auto v = need_int(w, key);
      if (!v.ok()) return v.status();
      *dst = *v;
    }
    auto kind = ParseIdleKind(w.value("kind", ""));
    if (!kind.ok()) return kind.status();
    iw.kind = *kind;
    iw.confidence = w.value("confidence", 0.0);
    // Version 2 fields; a version-1 window is its own sure interval.
    iw.phase = w.value("phase", "");
    iw.earliest_start_ns = w.value("earliest_start_ns", iw.start_ns);
    iw.latest_start_ns = w.value("latest_start_ns", iw.start_ns);
    iw.guaranteed_ns = w.value("guaranteed_ns", iw.duration_ns);
    iw.expected_ns = w.value("expected_ns", iw.duration_ns);
    iw.ordinal = w.value("ordinal", 0);
    iw.before_step = w.value("before_step", false);
    f.windows.push_back(iw);
  }
  return f;
}

}  // namespace

absl::StatusOr<Forecast> ForecastFromJson(const std::string& text) {
  return internal::CatchJsonErrors<Forecast>("forecast", [&] { return ParseForecast(text); });
}

std::string ForecastToTable(const Forecast& f, int max_rows) {
  std::string out = absl::StrFormat(
      "forecast after step %d (confidence %.3f): devices needed again in %.3f ms; "
      "%d idle windows, %.1f ms sure idle in the next %.0f s\n",
      f.last_step, f.confidence, static_cast<double>(f.devices_needed_at_ns - f.made_at_ns) / 1e6,
      static_cast<int>(f.windows.size()), static_cast<double>(f.total_idle_ns()) / 1e6,
      static_cast<double>(f.horizon_ns) / 1e9);
  absl::StrAppend(&out,
                  absl::StrFormat("  %10s %12s %12s %12s %12s  %-16s %s\n", "step", "start(ms)",
                                  "sure(ms)", "guarant(ms)", "expect(ms)", "kind", "phase"));
  int rows = 0;
  for (const IdleWindow& w : f.windows) {
    if (rows++ >= max_rows) {
      absl::StrAppend(
          &out, absl::StrFormat("  ... %d more\n", static_cast<int>(f.windows.size()) - max_rows));
      break;
    }
    absl::StrAppend(
        &out,
        absl::StrFormat("  %10d %12.3f %12.3f %12.3f %12.3f  %-16s %s\n", w.step,
                        static_cast<double>(w.latest_start_ns - f.made_at_ns) / 1e6,
                        static_cast<double>(w.duration_ns) / 1e6,
                        static_cast<double>(w.guaranteed_ns) / 1e6,
                        static_cast<double>(w.expected_ns) / 1e6, std::string(IdleKindName(w.kind)),
                        w.before_step ? std::string("(before the step)") : w.phase));
  }
  if (!f.next_steps.empty()) {
    // Four significant digits: microsecond steps (a tight loop) do not read as 0.0.
    absl::StrAppend(&out, "  next steps (ms):");
    for (const StepBound& b : f.next_steps) {
      absl::StrAppend(
          &out, absl::StrFormat(" %d:[%.4g, %.4g]", b.step, static_cast<double>(b.lo_ns) / 1e6,
                                static_cast<double>(b.hi_ns) / 1e6));
      if (b.gap_hi_ns > 0) {
        absl::StrAppend(&out,
                        absl::StrFormat("+%.4g before", static_cast<double>(b.gap_hi_ns) / 1e6));
      }
    }
    absl::StrAppend(&out, "\n");
  }
  if (f.save_hi_ns > 0) {
    absl::StrAppend(&out, absl::StrFormat("  save takes at most %.4g ms\n",
                                          static_cast<double>(f.save_hi_ns) / 1e6));
  }
  return out;
}

}  // namespace omni
