// The forecaster on the traces shipped in tests/data (see tests/data/README.md):
// precision and recall must not fall below what the current model reaches on
// them (the bounds are those figures, rounded down).
#include <gtest/gtest.h>

#include <string>

#include "omni/evaluator.h"

namespace omni {
namespace {

EvaluationReport EvaluateTrace(const std::string& name, int stride,
                               Scoring scoring = Scoring::kLive) {
  auto log = ReadStepLog(std::string(OMNI_TEST_DATA_DIR) + "/" + name);
  EXPECT_TRUE(log.ok()) << log.status();
  EvaluateOptions o;
  o.stride_steps = stride;
  o.scoring = scoring;
  auto rep = Evaluate(*log, o);
  EXPECT_TRUE(rep.ok()) << rep.status();
  return rep.ok() ? *rep : EvaluationReport{};
}

const EvaluationReport::Score& Kind(const EvaluationReport& r, IdleKind k) {
  return r.by_kind[static_cast<int>(k)];
}

// Measured (stride 1, live scoring, confidence 0.9545): precision 0.991,
// recall 0.901; checkpoint 1.000 / 0.873; pipeline_bubble 0.990 / 0.946
// (windows count from their open for their guaranteed length; the
// calibrator narrows them until their time-weighted precision nears its
// target, 1 − 0.75·α ≈ 0.966).
TEST(TraceEval, PipelineWithCheckpointsForecastsBubblesAndCheckpoints) {
  const EvaluationReport r = EvaluateTrace("pipeline_ckpt.jsonl", 1);
  EXPECT_GT(r.forecasts, 1000);
  EXPECT_GE(r.total.precision(), 0.9545);
  EXPECT_GE(r.total.recall(), 0.85);
  EXPECT_GE(Kind(r, IdleKind::kCheckpoint).precision(), 0.9545);
  EXPECT_GE(Kind(r, IdleKind::kCheckpoint).recall(), 0.8);
  EXPECT_GE(Kind(r, IdleKind::kPipelineBubble).precision(), 0.9545);
  EXPECT_GE(Kind(r, IdleKind::kPipelineBubble).recall(), 0.9);
}

// Measured: precision 1.000, recall 0.791; eval 1.000 / 0.825 (the eval's
// first occurrence is not forecast, its second only by the small-sample
// prior). Horizon scoring: precision 1.000.
TEST(TraceEval, SteadyTextTrainingForecastsItsEvalWindows) {
  const EvaluationReport r = EvaluateTrace("steady_text.jsonl", 1);
  EXPECT_GT(r.forecasts, 500);
  EXPECT_GE(r.total.precision(), 0.99);
  EXPECT_GE(r.total.recall(), 0.75);
  EXPECT_GE(Kind(r, IdleKind::kEval).recall(), 0.8);
  const EvaluationReport h = EvaluateTrace("steady_text.jsonl", 1, Scoring::kHorizon);
  EXPECT_GE(h.total.precision(), 0.97);
}

// Heavy-tailed data stalls cannot be forecast with 95% confidence (their
// lower bound is ~0), and a stall just before an eval step shifts that eval
// by up to ~100 ms: the evals are claimed from the moment they open. Measured:
// precision 1.000, recall 0.275; eval 1.000 / 0.854; data_stall recall 0.
TEST(TraceEval, MultimodalWithHeavyTailedStallsStaysPreciseAndClaimsItsEvals) {
  const EvaluationReport r = EvaluateTrace("multimodal_stalls.jsonl", 1);
  EXPECT_GT(r.forecasts, 500);
  EXPECT_GE(r.total.precision(), 0.9545);
  EXPECT_GE(Kind(r, IdleKind::kEval).recall(), 0.8);
}

TEST(TraceEval, PipelineLongRangeForecastsStayPrecise) {
  // Horizon scoring: every window of every forecast, up to 5 minutes ahead.
  // Measured: precision 0.999.
  const EvaluationReport h = EvaluateTrace("pipeline_ckpt.jsonl", 5, Scoring::kHorizon);
  EXPECT_GE(h.total.precision(), 0.97);
}

}  // namespace
}  // namespace omni
