// A replica's replicated state for the elastic tests: some weights and a
// step counter, registered as two objects ("w", "train").
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "omni/state.h"

namespace omni::test_util {

struct Replica {
  Replica(size_t n, float fill)
      : weights(n, fill), w_state("values", weights.data(), n * sizeof(float)) {
    EXPECT_TRUE(state.Register("w", &w_state).ok());
    EXPECT_TRUE(state.Register("train", &step_state).ok());
  }
  std::vector<float> weights;
  int64_t step = 0;
  BytesState w_state;
  BytesState step_state{"step", &step, sizeof(step)};
  StateRegistry state;
};

inline std::unique_ptr<Replica> MakeReplica(size_t n, float fill) {
  return std::make_unique<Replica>(n, fill);
}

}  // namespace omni::test_util
