// Forecast quality on the trace corpus (tests/data/README.md): live-scored
// window precision and recall, and next-step bound coverage and slack, per
// trace, against the goals of issue 9:
//  - precision ≥ the claimed confidence on every trace;
//  - recall ≥ 0.8 of the predictable idle time (the kinds that are periodic
//    or declared in that trace; traces without any have no recall goal);
//  - next-step coverage ≥ the claimed confidence with median slack ≤ 1.15.
// Beside each trace's slack, its floor: the median slack of the tightest
// bound that knows the whole log in advance but not which step comes next
// beyond its kind (per step kind, the in-hindsight quantile at the claimed
// confidence). Where the floor is above 1.15 the slack goal cannot be met by
// any bound that covers the claimed rate without per-step information (the
// heavy-tailed and bimodal traces draw every step independently).
// Beside each recall, its ceiling (RecallCeiling): without the idle time of
// an undeclared event's first two occurrences, which no online forecaster
// can claim; a recall goal missed where the ceiling is below 0.8 is counted
// apart, as the slack goals below their floor are.
// Prints a table, then one JSON line ("forecast_quality").
#include <algorithm>
#include <array>
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
  bool held_out = false;                    // not tuned on (tests/data/README.md): counted apart
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
      // Regressions (tuned on since): a stress test's findings.
      {"rhythm_change.jsonl", {K::kDataStall}},
      {"events_on_rhythm.jsonl", {K::kDataStall, K::kEval, K::kCheckpoint}},
      {"slow_spells.jsonl", {K::kDataStall, K::kEval}},
      {"rare_events.jsonl", {K::kEval, K::kCheckpoint}},
      {"coin_waits.jsonl", {}},
      {"coin_waits_parity.jsonl", {}},
      {"alternating_evals.jsonl", {K::kEval}},
      {"epoch_ramp.jsonl", {}},
      {"split_eval.jsonl", {K::kEval}},
      {"eval_loop.jsonl", {K::kEval}},
      {"host_gaps.jsonl", {K::kHostSide, K::kEval}},
      // Recorded (tools/record_lm_steplog.py), tuned on: its first
      // checkpoint ran cold (ColdStart in forecast_windows.cc).
      {"lm_microbatch.jsonl", {K::kEval, K::kCheckpoint}},
      // Held out (tests/data/README.md): not tuned on.
      {"drift.jsonl", {K::kEval}, true},
      {"contention.jsonl", {K::kCheckpoint}, true},
      {"bursty_stalls.jsonl", {}, true},
      {"time_ckpt.jsonl", {K::kEval}, true},
      {"straggler.jsonl", {}, true},
      {"sampled5.jsonl", {K::kDataStall, K::kEval}, true},
      {"gc_pauses.jsonl", {K::kEval}, true},
      {"pytorch_dataloader.jsonl", {K::kEval, K::kCheckpoint}, true},
      // Saves by wall time (recorded 2026-12-06): not predictable by step.
      {"wallclock_ckpt.jsonl", {K::kEval}, true},
      // Recorded 2026-12-07, not tuned on. The same example by wall time
      // beside a busy loop for 25 s of its ~40; the LM trainer evaluating
      // every 30 steps; omni_train fetching a shard every 16 steps (whose
      // heavy-tailed decode waits, in the same phase, are not predictable:
      // only its declared evals have a recall goal).
      {"dataloader_busy_host.jsonl", {K::kEval}, true},
      {"lm_eval30.jsonl", {K::kEval, K::kCheckpoint}, true},
      {"sharded_fetch.jsonl", {K::kEval}, true},
      // Two elastic replicas, one killed mid-step and one joining
      // (tools/record_elastic_steplog.py), not tuned on: its job-level saves
      // vary 14-149 ms.
      {"elastic_replica_lost.jsonl", {K::kEval, K::kCheckpoint}, true},
  };
}

std::string Num(double v) {
  return std::isnan(v) ? "null" : absl::StrCat(std::round(v * 1e4) / 1e4);
}
std::string Bool(bool b) { return b ? "true" : "false"; }

// The slack floor (see the file comment).
double SlackFloor(const omni::StepLog& log, double confidence) {
  std::array<std::vector<double>, omni::kNumStepKinds> by_kind;
  for (const omni::StepRecord& r : log.steps) {
    by_kind[static_cast<int>(r.kind())].push_back(static_cast<double>(r.duration_ns()));
  }
  std::vector<double> slack;
  for (std::vector<double>& d : by_kind) {
    if (d.empty()) continue;
    std::vector<double> sorted = d;
    std::sort(sorted.begin(), sorted.end());
    const double pos = confidence * static_cast<double>(sorted.size() - 1);
    const auto i = static_cast<size_t>(std::floor(pos));
    const double hi = i + 1 < sorted.size()
                          ? sorted[i] + (pos - static_cast<double>(i)) * (sorted[i + 1] - sorted[i])
                          : sorted.back();
    for (const double x : d) {
      if (x > 0) slack.push_back(hi / x);
    }
  }
  if (slack.empty()) return std::nan("");
  std::nth_element(slack.begin(), slack.begin() + static_cast<std::ptrdiff_t>(slack.size() / 2),
                   slack.end());
  return slack[slack.size() / 2];
}

// The recall ceiling: the share of the predictable idle time (`kinds`;
// host-side time includes the gaps between steps) an online forecaster can
// claim at all. It cannot claim an undeclared
// event's first occurrence, nor its second (a period needs two); the
// idle time of those is left out. Other losses (a guaranteed length below
// the real one, a residue class that needs three stalls) are not: the
// ceiling is an upper bound.
double RecallCeiling(const omni::StepLog& log, const std::vector<omni::IdleKind>& kinds) {
  using K = omni::IdleKind;
  const auto declared = [&](K k) {
    return (k == K::kEval && log.header.eval.every_steps > 0) ||
           (k == K::kCheckpoint && log.header.checkpoint.every_steps > 0);
  };
  int64_t real = 0, unclaimable = 0;
  std::array<int, omni::kNumIdleKinds> seen{};  // steps with the kind's idle time so far
  for (size_t j = 0; j < log.steps.size(); ++j) {
    const omni::StepRecord& r = log.steps[j];
    std::array<int64_t, omni::kNumIdleKinds> in_step{};
    omni::ForEachIdleInterval(r, log.header.phases, [&](const omni::IdleInterval& iv) {
      in_step[static_cast<size_t>(iv.kind)] += iv.end_ns - iv.start_ns;
    });
    if (j > 0 && r.step == log.steps[j - 1].step + 1) {  // the gap before it (host-side)
      in_step[static_cast<size_t>(K::kHostSide)] += r.start_ns - log.steps[j - 1].end_ns;
    }
    for (const K k : kinds) {
      const auto i = static_cast<size_t>(k);
      if (in_step[i] <= 0) continue;
      real += in_step[i];
      const bool event = k == K::kEval || k == K::kCheckpoint;
      if (event && !declared(k) && seen[i] < 2) unclaimable += in_step[i];
      ++seen[i];
    }
  }
  return real > 0 ? 1 - static_cast<double>(unclaimable) / static_cast<double>(real) : std::nan("");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : std::string(OMNI_SOURCE_DIR "/tests/data");
  std::vector<std::string> rows;
  // [0]: the corpus, [1]: the held-out traces.
  std::array<int, 2> goals{}, met{}, unreachable{}, beyond_ceiling{};
  bool printed_held_out = false;
  std::printf("%-26s %9s %7s %7s %7s %9s %7s %7s  goals (precision recall coverage slack)\n",
              "trace", "precision", "recall", "pred.r", "claimed", "coverage", "slack", "floor");
  for (const Trace& t : Corpus()) {
    const int set = t.held_out ? 1 : 0;
    if (t.held_out && !printed_held_out) {
      std::printf("-- held out (not tuned on):\n");
      printed_held_out = true;
    }
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
    const double ceiling = has_recall_goal ? RecallCeiling(*log, t.predictable) : std::nan("");
    if (!recall_ok && ceiling < 0.8) ++beyond_ceiling[set];
    const double coverage = rep->next_step.coverage();
    const bool coverage_ok = coverage >= claimed;
    const bool slack_ok = rep->next_step.slack_median <= 1.15;
    const double floor = SlackFloor(*log, claimed);
    if (!slack_ok && floor > 1.15) ++unreachable[set];
    goals[set] += 3 + (has_recall_goal ? 1 : 0);
    met[set] += (precision_ok ? 1 : 0) + (has_recall_goal && recall_ok ? 1 : 0) +
                (coverage_ok ? 1 : 0) + (slack_ok ? 1 : 0);
    std::string name = t.file;
    name = name.substr(0, name.size() - 6);
    std::printf("%-26s %9.4f %7.4f %7s %7.4f %9.4f %7.3f %7.3f  %s %s %s %s\n", name.c_str(),
                precision, rep->total.recall(), has_recall_goal ? Num(pred_recall).c_str() : "-",
                claimed, coverage, rep->next_step.slack_median, floor, precision_ok ? "ok" : "MISS",
                has_recall_goal
                    ? (recall_ok ? "ok" : (ceiling < 0.8 ? "MISS (ceiling below 0.8)" : "MISS"))
                    : "-",
                coverage_ok ? "ok" : "MISS",
                slack_ok ? "ok" : (floor > 1.15 ? "MISS (floor above 1.15)" : "MISS"));
    rows.push_back(absl::StrCat(
        "\"", name, "\":{\"precision\":", Num(precision), ",\"recall\":", Num(rep->total.recall()),
        ",\"predictable_recall\":", Num(pred_recall), ",\"recall_ceiling\":", Num(ceiling),
        ",\"claimed_confidence\":", Num(claimed), ",\"held_out\":", Bool(t.held_out),
        ",\"next_step_coverage\":", Num(coverage), ",\"next_step_slack_median\":",
        Num(rep->next_step.slack_median), ",\"next_step_slack_floor\":", Num(floor),
        ",\"regime_changes\":", rep->regime_changes, ",\"transients\":", rep->transients,
        ",\"notice_precision\":", Num(rep->notices.total.precision()),
        ",\"notice_recall\":", Num(rep->notices.total.recall()), ",\"notice_first_claims_held\":",
        Num(rep->notices.first_claims > 0 ? static_cast<double>(rep->notices.first_claims_held) /
                                                static_cast<double>(rep->notices.first_claims)
                                          : std::nan("")),
        ",\"notice_forecast_matched\":", rep->notices.forecast_matched,
        ",\"combined_precision\":", Num(rep->combined_total.precision()), ",\"combined_recall\":",
        Num(rep->combined_total.recall()), ",\"goals\":{\"precision\":", Bool(precision_ok),
        ",\"recall\":", has_recall_goal ? Bool(recall_ok) : "null",
        ",\"coverage\":", Bool(coverage_ok), ",\"slack\":", Bool(slack_ok),
        ",\"slack_reachable\":", Bool(floor <= 1.15),
        ",\"recall_reachable\":", has_recall_goal ? Bool(ceiling >= 0.8) : "null", "}}"));
  }
  std::printf(
      "corpus: %d of %d goals met (%d missed slack goals below their trace's floor, %d missed "
      "recall goals beyond their ceiling); held out: %d of %d (%d, %d)\n",
      met[0], goals[0], unreachable[0], beyond_ceiling[0], met[1], goals[1], unreachable[1],
      beyond_ceiling[1]);
  std::printf(
      "{\"benchmark\":\"forecast_quality\",\"goals_met\":%d,\"goals\":%d,"
      "\"slack_goals_below_floor\":%d,\"held_out_goals_met\":%d,\"held_out_goals\":%d,"
      "\"held_out_slack_goals_below_floor\":%d,\"recall_goals_beyond_ceiling\":%d,"
      "\"held_out_recall_goals_beyond_ceiling\":%d,\"traces\":{%s}}\n",
      met[0], goals[0], unreachable[0], met[1], goals[1], unreachable[1], beyond_ceiling[0],
      beyond_ceiling[1], absl::StrJoin(rows, ",").c_str());
  return 0;
}
