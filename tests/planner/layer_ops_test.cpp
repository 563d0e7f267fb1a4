#include "distplan/planner/layer_ops.h"

#include <gtest/gtest.h>

#include "distplan/planner/presets.h"

namespace distplan {
namespace {

TEST(LayerOps, GptLayerHasTwelveHSquaredParameters) {
  ModelSpec m = *find_model_preset("gpt3-175b");
  const LayerTable t = build_layer_table(m, TrainingSpec{});
  const Count h = m.hidden_size;
  // 12h^2 weights + 13h biases and norm parameters (Narayanan et al. 2021, sec. 5.1).
  EXPECT_EQ(layer_parameters(t), 12 * h * h + 13 * h);
}

}  // namespace
}  // namespace distplan
