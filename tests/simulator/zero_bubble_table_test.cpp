// The Zero Bubble paper's own numbers (Qi et al. 2023, ICLR 2024): fed its profiled pass and p2p
// times (Table 9), the simulator reproduces the bubble rates of Table 5 for 1F1B, ZB-H1 and ZB-H2
// on every row (data/reference/zero_bubble_table5.json, with its source).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

#include "distplan/planner/presets.h"
#include "distplan/simulator/simulate.h"
#include "sim_fixtures.h"

namespace distplan::sim {
namespace {

using testing::pipeline;
using testing::uniform_estimate;
using testing::with_costs;

TEST(ZeroBubbleTable5, SimulatedBubbleRatesMatchThePaper) {
  const auto text = embedded_data_file("reference/zero_bubble_table5.json");
  ASSERT_TRUE(text.has_value());
  const nlohmann::json ref = nlohmann::json::parse(*text);
  const double tol = ref.at("tolerance").get<double>();
  const auto& rows = ref.at("rows");
  ASSERT_EQ(rows.size(), 12u);
  for (const auto& row : rows) {
    const std::string model = row[0].get<std::string>();
    const Count p = row[1].get<Count>(), m = row[2].get<Count>();
    const double us = 1e-6;
    const double f = row[3].get<double>() * us, b = row[4].get<double>() * us,
                 w = row[5].get<double>() * us, c = row[6].get<double>() * us;
    const std::string label = model + " p=" + std::to_string(p) + " m=" + std::to_string(m);
    // 1F1B runs B and W as one backward pass.
    const SimResult one = simulate(pipeline(p, m, Schedule::one_f_one_b), uniform_estimate(p),
                                   with_costs(f, b + w, 0.0, c));
    const SimResult h1 =
        simulate(pipeline(p, m, Schedule::zb_h1), uniform_estimate(p), with_costs(f, b, w, c));
    const SimResult h2 =
        simulate(pipeline(p, m, Schedule::zb_h2), uniform_estimate(p), with_costs(f, b, w, c));
    EXPECT_NEAR(one.bubble_fraction, row[7].get<double>(), tol) << "1f1b " << label;
    EXPECT_NEAR(h1.bubble_fraction, row[8].get<double>(), tol) << "zb_h1 " << label;
    EXPECT_NEAR(h2.bubble_fraction, row[9].get<double>(), tol) << "zb_h2 " << label;
    // ZB-H2's step is one stage's span: m (F + B + W) + (p - 1)(F + B + 2c - 2W) when F + B >= 2W
    // (the assertion in the authors' script), the first stage starting its next step while the
    // last still runs this one.
    const double span =
        static_cast<double>(m) * (f + b + w) + static_cast<double>(p - 1) * (f + b + 2 * c - 2 * w);
    EXPECT_NEAR(h2.step_seconds, span, 1e-9 * span) << label;
  }
}

}  // namespace
}  // namespace distplan::sim
