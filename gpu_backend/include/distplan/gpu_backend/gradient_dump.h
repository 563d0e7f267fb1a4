// One rank's gradients after the first step's gradient reduction, element by element with the
// parameter and the element's index in the unsharded tensor, so that the shards of any layout
// reassemble into full gradients and compare with one rank's (RunOptions::dump_gradients,
// docs/gpu_backend.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distplan/planner/spec.h"

namespace distplan::backend {

/// The elements of one parameter this rank holds the reduced gradient of.
struct GradientRecord {
  std::uint64_t param = 0;   // the parameter's id: layer * 64 + slot (see parameter_name)
  std::vector<Count> index;  // row-major index into the unsharded parameter
  std::vector<float> value;  // the gradient, unscaled (fp16 loss scale divided out)
};

/// Writes `records` to `path` (a small binary format read by read_gradient_dump).
void write_gradient_dump(const std::string& path, const std::vector<GradientRecord>& records);

/// Reads a file written by write_gradient_dump; throws std::runtime_error when it is not one.
[[nodiscard]] std::vector<GradientRecord> read_gradient_dump(const std::string& path);

/// A parameter id for people: "layer 3 qkv weight", "embedding word", "lm head weight".
[[nodiscard]] std::string parameter_name(std::uint64_t param);

}  // namespace distplan::backend
