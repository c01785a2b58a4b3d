#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
                  {"step", w.step}});
  }
  j["windows"] = std::move(ws);
  return j.dump();
}

absl::StatusOr<Forecast> ForecastFromJson(const std::string& text) {
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
    f.windows.push_back(iw);
  }
  return f;
}

std::string ForecastToTable(const Forecast& f, int max_rows) {
  std::string out = absl::StrFormat(
      "forecast after step %d (k=%.2f, confidence >= %.3f): devices needed again in %.3f ms; "
      "%d idle windows, %.1f ms idle in the next %.0f s\n",
      f.last_step, f.k,
      f.windows.empty() ? std::erf(f.k / std::sqrt(2.0)) : f.windows[0].confidence,
      static_cast<double>(f.devices_needed_at_ns - f.made_at_ns) / 1e6,
      static_cast<int>(f.windows.size()), static_cast<double>(f.total_idle_ns()) / 1e6,
      static_cast<double>(f.horizon_ns) / 1e9);
  absl::StrAppend(&out, absl::StrFormat("  %10s %12s %12s  %-16s %6s\n", "step", "start(ms)",
                                        "dur(ms)", "kind", "conf"));
  int rows = 0;
  for (const IdleWindow& w : f.windows) {
    if (rows++ >= max_rows) {
      absl::StrAppend(
          &out, absl::StrFormat("  ... %d more\n", static_cast<int>(f.windows.size()) - max_rows));
      break;
    }
    absl::StrAppend(&out, absl::StrFormat("  %10d %12.3f %12.3f  %-16s %6.3f\n", w.step,
                                          static_cast<double>(w.start_ns - f.made_at_ns) / 1e6,
                                          static_cast<double>(w.duration_ns) / 1e6,
                                          std::string(IdleKindName(w.kind)), w.confidence));
  }
  return out;
}

}  // namespace omni
