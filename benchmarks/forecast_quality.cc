// Forecast quality on the trace corpus (tests/data/README.md): live-scored
// window precision and recall, and next-step bound coverage and slack, per
// trace, against the goals of issue 9:
//  - precision ≥ the claimed confidence on every trace;
//  - recall ≥ 0.8 of the predictable idle time (the kinds that are periodic
//    or declared in that trace; traces without any have no recall goal);
//  - next-step coverage ≥ the claimed confidence with median slack ≤ 1.15.
// Prints a table, then one JSON line ("forecast_quality").
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "omni/evaluator.h"

namespace {

struct Trace {
  const char* file;
  std::vector<omni::IdleKind> predictable;  // empty: no recall goal
};

std::vector<Trace> Corpus() {
  using K = omni::IdleKind;
  return {
      {"steady.jsonl", {}},
      {"heavy_stalls.jsonl", {}},
      {"stall_every3.jsonl", {K::kDataStall}},
      {"periodic_declared.jsonl", {K::kEval, K::kCheckpoint}},
      {"periodic_undeclared.jsonl", {K::kEval, K::kCheckpoint}},
      {"pipeline_ckpt.jsonl", {K::kPipelineBubble, K::kCheckpoint}},
      {"restart.jsonl", {}},
      {"sampled10.jsonl", {K::kDataStall, K::kEval}},
      {"rlhf_bimodal.jsonl", {}},
      {"steady_text.jsonl", {K::kEval}},
      {"multimodal_stalls.jsonl", {K::kEval}},
  };
}

std::string Num(double v) {
  return std::isnan(v) ? "null" : absl::StrCat(std::round(v * 1e4) / 1e4);
}
std::string Bool(bool b) { return b ? "true" : "false"; }

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : std::string(OMNI_SOURCE_DIR "/tests/data");
  std::vector<std::string> rows;
  int goals = 0, met = 0;
  std::printf("%-26s %9s %7s %7s %7s %9s %7s  goals (precision recall coverage slack)\n", "trace",
              "precision", "recall", "pred.r", "claimed", "coverage", "slack");
  for (const Trace& t : Corpus()) {
    auto log = omni::ReadStepLog(dir + "/" + t.file);
    if (!log.ok()) {
      std::fprintf(stderr, "%s\n", std::string(log.status().message()).c_str());
      return 1;
    }
    auto rep = omni::Evaluate(*log, omni::EvaluateOptions{});
    if (!rep.ok()) {
      std::fprintf(stderr, "%s: %s\n", t.file, std::string(rep.status().message()).c_str());
      return 1;
    }
    const double claimed = rep->claimed_confidence;
    // Precision: with no window published there is nothing false either.
    const double precision = rep->total.precision();
    const bool precision_ok = std::isnan(precision) || precision >= claimed;
    int64_t real = 0, covered = 0;
    for (const omni::IdleKind k : t.predictable) {
      real += rep->by_kind[static_cast<int>(k)].real_ns;
      covered += rep->by_kind[static_cast<int>(k)].real_covered_ns;
    }
    const double pred_recall =
        real > 0 ? static_cast<double>(covered) / static_cast<double>(real) : std::nan("");
    const bool has_recall_goal = !t.predictable.empty() && real > 0;
    const bool recall_ok = !has_recall_goal || pred_recall >= 0.8;
    const double coverage = rep->next_step.coverage();
    const bool coverage_ok = coverage >= claimed;
    const bool slack_ok = rep->next_step.slack_median <= 1.15;
    goals += 3 + (has_recall_goal ? 1 : 0);
    met += (precision_ok ? 1 : 0) + (has_recall_goal && recall_ok ? 1 : 0) + (coverage_ok ? 1 : 0) +
           (slack_ok ? 1 : 0);
    std::string name = t.file;
    name = name.substr(0, name.size() - 6);
    std::printf("%-26s %9.4f %7.4f %7s %7.4f %9.4f %7.3f  %s %s %s %s\n", name.c_str(), precision,
                rep->total.recall(), has_recall_goal ? Num(pred_recall).c_str() : "-", claimed,
                coverage, rep->next_step.slack_median, precision_ok ? "ok" : "MISS",
                has_recall_goal ? (recall_ok ? "ok" : "MISS") : "-", coverage_ok ? "ok" : "MISS",
                slack_ok ? "ok" : "MISS");
    rows.push_back(absl::StrCat(
        "\"", name, "\":{\"precision\":", Num(precision), ",\"recall\":", Num(rep->total.recall()),
        ",\"predictable_recall\":", Num(pred_recall), ",\"claimed_confidence\":", Num(claimed),
        ",\"next_step_coverage\":", Num(coverage), ",\"next_step_slack_median\":",
        Num(rep->next_step.slack_median), ",\"regime_changes\":", rep->regime_changes,
        ",\"goals\":{\"precision\":", Bool(precision_ok),
        ",\"recall\":", has_recall_goal ? Bool(recall_ok) : "null",
        ",\"coverage\":", Bool(coverage_ok), ",\"slack\":", Bool(slack_ok), "}}"));
  }
  std::printf("%d of %d goals met\n", met, goals);
  std::printf(
      "{\"benchmark\":\"forecast_quality\",\"goals_met\":%d,\"goals\":%d,\"traces\":{%s}}\n", met,
      goals, absl::StrJoin(rows, ",").c_str());
  return 0;
}
