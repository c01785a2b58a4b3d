// The forecaster on the traces shipped in tests/data (see tests/data/README.md):
// precision and recall must not fall below what it reached when the traces were
// recorded (the bounds are those figures, rounded down).
#include <gtest/gtest.h>

#include <string>

#include "omni/evaluator.h"

namespace omni {
namespace {

EvaluationReport EvaluateTrace(const std::string& name, int stride) {
  auto log = ReadStepLog(std::string(OMNI_TEST_DATA_DIR) + "/" + name);
  EXPECT_TRUE(log.ok()) << log.status();
  EvaluateOptions o;
  o.stride_steps = stride;
  auto rep = Evaluate(*log, o);
  EXPECT_TRUE(rep.ok()) << rep.status();
  return rep.ok() ? *rep : EvaluationReport{};
}

const EvaluationReport::Score& Kind(const EvaluationReport& r, IdleKind k) {
  return r.by_kind[static_cast<int>(k)];
}

// Measured when recorded (stride 1, live scoring, k = 2): precision 0.9995,
// recall 0.438; checkpoint 1.000 / 0.907; pipeline_bubble 0.9993 / 0.4135.
TEST(TraceEval, PipelineWithCheckpointsForecastsBubblesAndCheckpoints) {
  const EvaluationReport r = EvaluateTrace("pipeline_ckpt.jsonl", 1);
  EXPECT_GT(r.forecasts, 1000);
  EXPECT_GE(r.total.precision(), 0.99);
  EXPECT_GE(r.total.recall(), 0.40);
  EXPECT_GE(Kind(r, IdleKind::kCheckpoint).precision(), 0.99);
  EXPECT_GE(Kind(r, IdleKind::kCheckpoint).recall(), 0.85);
  EXPECT_GE(Kind(r, IdleKind::kPipelineBubble).precision(), 0.99);
  EXPECT_GE(Kind(r, IdleKind::kPipelineBubble).recall(), 0.38);
}

}  // namespace
}  // namespace omni
