// The synthetic step logs of the forecaster's trace corpus (tests/data/,
// documented in tests/data/README.md). Each scenario is deterministic for a
// seed on a given standard library.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace omni::tracegen {

// Names accepted by WriteScenario.
std::vector<std::string> ScenarioNames();

// Writes scenario `name` with `steps` steps (for "sampled10": steps run, of
// which every 10th is logged) to `path`. InvalidArgument for an unknown name.
absl::Status WriteScenario(const std::string& name, const std::string& path, int steps,
                           uint64_t seed);

}  // namespace omni::tracegen
