#include "plot.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli_numbers.h"
#include "nlohmann/json.hpp"
#include "omni/evaluator.h"
#include "omni/step_log.h"
#include "svg.h"

namespace omni::cli {
namespace {

struct Span {
  int64_t a = 0, b = 0;  // [a, b) clock ns
  IdleKind kind = IdleKind::kHostSide;
};

const char* KindColor(IdleKind k) {
  switch (k) {
    case IdleKind::kDataStall:
      return "#e45756";
    case IdleKind::kCheckpoint:
      return "#4c78a8";
    case IdleKind::kEval:
      return "#54a24b";
    case IdleKind::kPipelineBubble:
      return "#b279a2";
    case IdleKind::kHostSide:
      return "#9d755d";
    case IdleKind::kNone:
      break;
  }
  return "#888888";
}

// Real idle time: the innermost-phase rule inside steps and the gaps between
// steps (host-side), as omni eval counts it.
std::vector<Span> RealIdle(const StepLog& log) {
  std::vector<Span> out;
  for (size_t i = 0; i < log.steps.size(); ++i) {
    const StepRecord& rec = log.steps[i];
    if (i > 0 && rec.start_ns > log.steps[i - 1].end_ns) {
      out.push_back({log.steps[i - 1].end_ns, rec.start_ns, IdleKind::kHostSide});
    }
    ForEachIdleInterval(rec, log.header.phases, [&](const IdleInterval& iv) {
      out.push_back({iv.start_ns, iv.end_ns, iv.kind});
    });
  }
  return out;
}

// The live forecast windows: the forecast made at each step boundary, from
// that boundary until the next one, for boundaries whose range meets [t0, t1).
// `scored` is the time those forecasts cover (as omni eval scores them).
absl::StatusOr<std::vector<Span>> LiveForecast(const StepLog& log, const PlotOptions& o, int64_t t0,
                                               int64_t t1, int64_t& forecasts, Span& scored) {
  ForecastOptions fo = o.forecast;
  fo.checkpoint = log.header.checkpoint;
  fo.eval = log.header.eval;
  fo.pipeline = log.header.pipeline;
  auto forecaster = Forecaster::Create(fo);
  if (!forecaster.ok()) return forecaster.status();
  std::vector<Span> out;
  forecasts = 0;
  scored = {0, 0, IdleKind::kNone};
  if (o.previous != nullptr) {
    auto learned = PreviousRunSteps(*o.previous, log.steps.front(), log.header.phases,
                                    EvaluateOptions().previous_steps);
    if (!learned.ok()) return learned.status();
    for (const StepRecord& rec : *learned) {
      if (auto st = forecaster->Observe(rec, log.header.phases); !st.ok()) return st;
    }
  }
  // The same replay as omni eval: the forecaster learns each step as it
  // ends and forecasts from the past only.
  for (size_t i = 0; i < log.steps.size(); ++i) {
    const StepRecord& rec = log.steps[i];
    if (auto st = forecaster->Observe(rec, log.header.phases); !st.ok()) return st;
    if (i + 1 >= log.steps.size()) continue;
    const int64_t now = rec.end_ns;
    const int64_t until = log.steps[i + 1].end_ns;
    if (until <= t0 || now >= t1) continue;
    auto f = forecaster->Predict(now);
    if (!f.ok()) continue;  // too few steps in the current regime
    if (forecasts++ == 0) scored.a = now;
    scored.b = until;
    // Each window as omni eval scores it (WindowClaimedSpans): its sure part
    // and its guaranteed length from the moment it opened.
    for (const IdleWindow& w : f->windows) {
      const StepRecord* rec_w = nullptr;
      int64_t prev_end = -1;
      for (size_t j = i + 1; j < log.steps.size() && log.steps[j].start_ns < until; ++j) {
        if (log.steps[j].step != w.step) continue;
        rec_w = &log.steps[j];
        if (log.steps[j - 1].step == w.step - 1) prev_end = log.steps[j - 1].end_ns;
      }
      for (const ClaimedSpan& c : WindowClaimedSpans(w, rec_w, log.header.phases, fo, prev_end)) {
        Span s{std::max(c.start_ns, now), std::min(c.end_ns, until), w.kind};
        if (s.b > s.a) out.push_back(s);
      }
    }
  }
  if (forecasts == 0) {
    return absl::FailedPreconditionError(
        "no forecast in the plotted range: the log never has enough steps of one regime");
  }
  return out;
}

struct Score {
  int64_t forecast = 0, forecast_true = 0, real = 0, real_covered = 0;
};

// Overlap of two sorted lists of disjoint spans, clipped to [t0, t1).
void AddOverlaps(const std::vector<Span>& wins, const std::vector<Span>& real, int64_t t0,
                 int64_t t1, std::array<Score, kNumIdleKinds>& score) {
  size_t i = 0, j = 0;
  while (i < wins.size() && j < real.size()) {
    const int64_t lo = std::max({wins[i].a, real[j].a, t0});
    const int64_t hi = std::min({wins[i].b, real[j].b, t1});
    if (hi > lo) {
      score[static_cast<size_t>(wins[i].kind)].forecast_true += hi - lo;
      score[static_cast<size_t>(real[j].kind)].real_covered += hi - lo;
    }
    if (wins[i].b < real[j].b) {
      ++i;
    } else {
      ++j;
    }
  }
}

std::string Ratio(int64_t num, int64_t den) {
  return den > 0 ? absl::StrFormat("%.2f", static_cast<double>(num) / static_cast<double>(den))
                 : "-";
}

// A tick spacing of 1, 2 or 5 × 10^k seconds giving about `target` ticks.
double NiceStep(double span_s, int target) {
  const double raw = span_s / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * mag >= raw) return m * mag;
  }
  return 10 * mag;
}

}  // namespace

absl::StatusOr<GuestTrack> ReadGuestTrack(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read guest file ", path));
  GuestTrack g;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": not a JSON object"));
    }
    if (j.contains("start_ns") && j.contains("end_ns") && j["start_ns"].is_number_integer() &&
        j["end_ns"].is_number_integer()) {
      g.units.emplace_back(j["start_ns"].get<int64_t>(), j["end_ns"].get<int64_t>());
    } else if (j.contains("t_ns") && j["t_ns"].is_number_integer() && j.contains("mark") &&
               j["mark"].is_string()) {
      g.marks.emplace_back(j["t_ns"].get<int64_t>(), j["mark"].get<std::string>());
    }
  }
  return g;
}

absl::StatusOr<std::string> PlotTimeline(const StepLog& log, const PlotOptions& o) {
  if (log.steps.empty()) return absl::InvalidArgumentError("step log has no steps");
  size_t first = 0, last = log.steps.size() - 1;
  while (first < log.steps.size() && o.from_step >= 0 && log.steps[first].step < o.from_step) {
    ++first;
  }
  while (last > 0 && o.to_step >= 0 && log.steps[last].step > o.to_step) --last;
  if (first >= log.steps.size() || first > last) {
    return absl::InvalidArgumentError(
        absl::StrCat("no step of the log in the range [", o.from_step, ", ", o.to_step, "]"));
  }
  const int64_t t0 = log.steps[first].start_ns;
  const int64_t t1 = std::max(log.steps[last].end_ns, t0 + 1);

  std::vector<Span> real = RealIdle(log);
  int64_t forecasts = 0;
  Span scored;
  auto wins = LiveForecast(log, o, t0, t1, forecasts, scored);
  if (!wins.ok()) return wins.status();
  // Scores count the time some forecast covered, as omni eval does.
  const int64_t s0 = std::max(t0, scored.a), s1 = std::min(t1, scored.b);

  std::array<Score, kNumIdleKinds> score{};
  std::array<bool, kNumIdleKinds> shown{};
  for (const Span& s : real) {
    if (std::min(s.b, t1) > std::max(s.a, t0)) shown[static_cast<size_t>(s.kind)] = true;
    const int64_t len = std::min(s.b, s1) - std::max(s.a, s0);
    if (len > 0) score[static_cast<size_t>(s.kind)].real += len;
  }
  for (const Span& s : *wins) {
    if (std::min(s.b, t1) > std::max(s.a, t0)) shown[static_cast<size_t>(s.kind)] = true;
    const int64_t len = std::min(s.b, s1) - std::max(s.a, s0);
    if (len > 0) score[static_cast<size_t>(s.kind)].forecast += len;
  }
  AddOverlaps(*wins, real, s0, s1, score);

  // Layout.
  const double left = 170, right = 20, top = 64, lane_h = 50, strip_h = 16;
  int lanes = 0;
  for (int k = 1; k < kNumIdleKinds; ++k) lanes += shown[static_cast<size_t>(k)] ? 1 : 0;
  const double plot_w = std::max(200.0, o.width_px - left - right);
  const double lanes_top = top + strip_h + 10;
  const bool guest_lane = !o.guest.units.empty();
  const double guest_y = lanes_top + std::max(1, lanes) * lane_h;
  const double axis_y = guest_y + (guest_lane ? lane_h : 0) + 6;
  const double height = axis_y + 70;
  const double span_s = static_cast<double>(t1 - t0) / 1e9;
  const auto x_of = [&](int64_t t) {
    return left + plot_w * static_cast<double>(t - t0) / static_cast<double>(t1 - t0);
  };

  SvgWriter svg(left + plot_w + right, height);
  svg.Text(left, 22, o.title.empty() ? "omni plot" : o.title, 15, "start", "#111");
  svg.Text(left, 42,
           absl::StrFormat("steps %d-%d (%.3f s): real idle time against the forecast windows "
                           "live at each moment (%d forecasts, one per step boundary)",
                           log.steps[first].step, log.steps[last].step, span_s, forecasts),
           12, "start", "#444");

  // Step strip: alternating shades, with step numbers about every 60 px.
  svg.Text(left - 8, top + 12, "steps", 11, "end", "#444");
  for (size_t i = first; i <= last; ++i) {
    const StepRecord& rec = log.steps[i];
    const double x = x_of(rec.start_ns);
    const double w = std::max(0.5, x_of(rec.end_ns) - x);
    svg.Rect(x, top, w, strip_h, (i % 2) != 0U ? "#d9d9d9" : "#ececec", 1.0, "none",
             absl::StrFormat("step %d (%s): %.3f ms", rec.step, StepKindName(rec.kind()),
                             static_cast<double>(rec.duration_ns()) / 1e6));
  }
  double next_label_x = 0;  // labels at least 56 px apart, over the strip
  for (size_t i = first; i <= last; ++i) {
    const double x = x_of(log.steps[i].start_ns);
    if (x < next_label_x) continue;
    svg.Line(x, top, x, top + strip_h, "#555", 0.8);
    svg.Text(x + 2, top + 12, absl::StrCat(log.steps[i].step), 9, "start", "#222");
    next_label_x = x + 56;
  }

  // One lane per idle kind: real idle time above, forecast windows below.
  int lane = 0;
  for (int k = 1; k < kNumIdleKinds; ++k) {
    const auto kind = static_cast<IdleKind>(k);
    if (!shown[static_cast<size_t>(k)]) continue;
    const double y = lanes_top + lane * lane_h;
    ++lane;
    const Score& s = score[static_cast<size_t>(k)];
    svg.Rect(left, y, plot_w, lane_h - 6, "#fafafa", 1.0, "#e0e0e0");
    svg.Text(left - 8, y + 17, absl::StrCat(IdleKindName(kind), " real"), 12, "end", "#111");
    svg.Text(left - 8, y + 30, "forecast", 10, "end", "#333");
    svg.Text(left - 8, y + 41,
             absl::StrCat("precision ", Ratio(s.forecast_true, s.forecast), " recall ",
                          Ratio(s.real_covered, s.real)),
             9, "end", "#555");
    const char* color = KindColor(kind);
    for (const Span& r : real) {
      if (r.kind != kind || r.b <= t0 || r.a >= t1) continue;
      const double x = x_of(std::max(r.a, t0));
      svg.Rect(x, y + 5, std::max(1.0, x_of(std::min(r.b, t1)) - x), 16, color, 1.0, "none",
               absl::StrFormat("real %s: %.3f ms", IdleKindName(kind),
                               static_cast<double>(r.b - r.a) / 1e6));
    }
    for (const Span& w : *wins) {
      if (w.kind != kind || w.b <= t0 || w.a >= t1) continue;
      const double x = x_of(std::max(w.a, t0));
      svg.Rect(x, y + 24, std::max(1.0, x_of(std::min(w.b, t1)) - x), 16, color, 0.35, color,
               absl::StrFormat("forecast %s: %.3f ms", IdleKindName(kind),
                               static_cast<double>(w.b - w.a) / 1e6));
    }
  }
  if (lanes == 0) {
    svg.Text(left + plot_w / 2, lanes_top + 28, "no idle time and no forecast window in range", 12,
             "middle", "#777");
  }

  // The guest's units, and the marks across every lane.
  if (guest_lane) {
    int64_t busy = 0;
    for (const auto& [a, b] : o.guest.units)
      busy += std::max<int64_t>(0, std::min(b, t1) - std::max(a, t0));
    svg.Rect(left, guest_y, plot_w, lane_h - 6, "#fafafa", 1.0, "#e0e0e0");
    svg.Text(left - 8, guest_y + 20, o.guest.label.empty() ? "guest" : o.guest.label, 12, "end",
             "#111");
    svg.Text(left - 8, guest_y + 34,
             absl::StrFormat("%.3f s of work", static_cast<double>(busy) / 1e9), 9, "end", "#555");
    for (const auto& [a, b] : o.guest.units) {
      if (b <= t0 || a >= t1) continue;
      const double x = x_of(std::max(a, t0));
      svg.Rect(x, guest_y + 10, std::max(0.5, x_of(std::min(b, t1)) - x), 22, "#2ca02c", 1.0,
               "none", absl::StrFormat("guest unit: %.3f ms", static_cast<double>(b - a) / 1e6));
    }
  }
  int shown_marks = 0;  // labels staggered so that close marks stay readable
  for (const auto& [t, label] : o.guest.marks) {
    if (t < t0 || t > t1) continue;
    svg.Line(x_of(t), top, x_of(t), axis_y, "#d62728", 1.2);
    svg.Text(x_of(t) + 3, axis_y - 4 - 11.0 * (shown_marks++ % 3), label, 10, "start", "#d62728");
  }

  // Time axis, seconds from the first step shown.
  svg.Line(left, axis_y, left + plot_w, axis_y, "#444");
  const double tick = NiceStep(span_s, 10);
  const auto ticks = static_cast<int>(std::floor(span_s / tick + 1e-9));
  for (int i = 0; i <= ticks; ++i) {
    const double t = i * tick;
    const double x = left + plot_w * t / span_s;
    svg.Line(x, axis_y, x, axis_y + 5, "#444");
    svg.Text(x, axis_y + 17, absl::StrFormat("%g", t), 10, "middle", "#333");
  }
  svg.Text(left + plot_w / 2, axis_y + 33, "seconds since the first step shown", 11, "middle",
           "#333");
  // Legend.
  const double ly = axis_y + 50;
  svg.Rect(left, ly - 9, 18, 10, "#777777");
  svg.Text(left + 24, ly, "real idle time (from the step log)", 11);
  svg.Rect(left + 260, ly - 9, 18, 10, "#777777", 0.35, "#777777");
  svg.Text(left + 284, ly,
           "forecast window (made at the last step boundary: its sure part, and its guaranteed "
           "length from the moment it opened)",
           11);
  return svg.Finish();
}

void NoteUnfinishedTail(const std::string& path, const StepLog& log) {
  if (log.unfinished_tail_bytes == 0) return;
  std::fprintf(stderr,
               "omni: %s: left out its unfinished last line (%zu bytes: the log is being "
               "written, or its writer stopped mid-line)\n",
               path.c_str(), log.unfinished_tail_bytes);
}

int PlotCommand(int argc, char** argv) {
  const char* usage =
      "usage: omni plot LOG [--out FILE.svg] [--from-step N] [--to-step N] [--k K] "
      "[--horizon-s S] [--window N] [--width PX] [--guest G.jsonl [--guest-label L]] "
      "[--previous LOG2]\n";
  std::string log_path, out, guest_path, previous_path;
  PlotOptions o;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--", 0) != 0) {
      if (!log_path.empty()) {
        std::fprintf(stderr, "omni: plot takes exactly one step log\n%s", usage);
        return 2;
      }
      log_path = a;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "omni: missing value for %s\n%s", a.c_str(), usage);
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--out") {
      out = v;
      continue;
    }
    if (a == "--guest") {
      guest_path = v;
      continue;
    }
    if (a == "--previous") {
      previous_path = v;
      continue;
    }
    if (a == "--guest-label") {
      o.guest.label = v;
      continue;
    }
    // The ranges omni eval and omni forecast take (omni_cli.cc); a step
    // number as the log's (kMaxStepNumber). A value converted unchecked
    // was undefined past the int64 range: --from-step 9223372036854775807
    // plotted the whole log.
    std::string err;
    int64_t n = 0;
    double x = 0;
    bool ok = true;
    if (a == "--from-step" || a == "--to-step") {
      ok = ParseInteger(a, v, 0, kMaxStepNumber, n, err);
      (a == "--from-step" ? o.from_step : o.to_step) = n;
    } else if (a == "--k") {
      ok = ParseReal(a, v, 0, 1e6, o.forecast.k, err);
    } else if (a == "--horizon-s") {
      ok = ParseReal(a, v, 0, 9e9, x, err);
      o.forecast.horizon_ns = static_cast<int64_t>(x * 1e9);
    } else if (a == "--window") {
      ok = ParseInteger(a, v, 1, std::numeric_limits<int>::max(), n, err);
      o.forecast.history_steps = static_cast<int>(n);
    } else if (a == "--width") {
      ok = ParseReal(a, v, 200, 100'000, o.width_px, err);
    } else {
      err = "unknown flag " + a;
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "omni: %s\n%s", err.c_str(), usage);
      return 2;
    }
  }
  if (log_path.empty()) {
    std::fprintf(stderr, "omni: plot takes exactly one step log\n%s", usage);
    return 2;
  }
  if (out.empty()) {
    out = log_path;
    const size_t dot = out.rfind('.');
    const size_t slash = out.rfind('/');
    if (dot != std::string::npos && (slash == std::string::npos || dot > slash)) out.resize(dot);
    out += ".svg";
  }
  auto log = ReadStepLog(log_path);
  if (!log.ok()) {
    std::fprintf(stderr, "omni: %s\n", std::string(log.status().message()).c_str());
    return 1;
  }
  NoteUnfinishedTail(log_path, *log);
  o.title = absl::StrCat("omni plot ", log_path);
  if (!guest_path.empty()) {
    const std::string label = o.guest.label;
    auto guest = ReadGuestTrack(guest_path);
    if (!guest.ok()) {
      std::fprintf(stderr, "omni: %s\n", std::string(guest.status().message()).c_str());
      return 1;
    }
    o.guest = *std::move(guest);
    o.guest.label = label;
  }
  absl::StatusOr<StepLog> previous;
  if (!previous_path.empty()) {
    previous = ReadStepLogTail(previous_path, EvaluateOptions().previous_steps);
    if (!previous.ok()) {
      std::fprintf(stderr, "omni: %s\n", std::string(previous.status().message()).c_str());
      return 1;
    }
    o.previous = &*previous;
  }
  auto svg = PlotTimeline(*log, o);
  if (!svg.ok()) {
    std::fprintf(stderr, "omni: %s\n", std::string(svg.status().message()).c_str());
    return 1;
  }
  std::ofstream f(out, std::ios::binary | std::ios::trunc);
  f << *svg;
  f.close();
  if (!f) {
    std::fprintf(stderr, "omni: cannot write %s\n", out.c_str());
    return 1;
  }
  std::printf("%s\n", out.c_str());
  return 0;
}

}  // namespace omni::cli
