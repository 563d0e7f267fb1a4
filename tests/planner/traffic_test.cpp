// Traffic ids (traffic.h): each id's display name reads back to it, and the unit family is laid
// out as its kinds x units (a wrong stride would name another unit's traffic).
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "distplan/planner/traffic.h"

namespace distplan {
namespace {

TEST(Traffic, EveryNameReadsBackToItsId) {
  std::set<std::string> seen;
  for (int i = 0; i < kTraffics; ++i) {
    const auto t = static_cast<Traffic>(i);
    const std::string name(to_string(t));
    EXPECT_TRUE(seen.insert(name).second) << name;
    ASSERT_TRUE(traffic_from_string(name).has_value()) << name;
    EXPECT_EQ(*traffic_from_string(name), t) << name;
  }
  EXPECT_FALSE(traffic_from_string("sequence-parallel gradients").has_value());
  EXPECT_FALSE(traffic_from_string("").has_value());
}

TEST(Traffic, UnitFamilyNamesItsKindAndUnit) {
  const char* units[] = {"layers", "embedding", "lm head", "experts", "adapters"};
  for (int u = 0; u < kParamUnits; ++u) {
    const auto pu = static_cast<ParamUnit>(u);
    const std::string n = units[u];
    EXPECT_EQ(to_string(unit_traffic(UnitTraffic::gradients, pu)), "gradients (" + n + ")");
    EXPECT_EQ(to_string(unit_traffic(UnitTraffic::parameters, pu)), "parameters (" + n + ")");
    EXPECT_EQ(to_string(unit_traffic(UnitTraffic::gather_forward_backward, pu)),
              "parameters (" + n + ", forward+backward)");
    EXPECT_EQ(to_string(unit_traffic(UnitTraffic::gather_forward, pu)),
              "parameters (" + n + ", forward)");
    EXPECT_EQ(to_string(unit_traffic(UnitTraffic::sp_gradients, pu)),
              "sequence-parallel gradients (" + n + ")");
  }
  // The family ends where the other ids begin.
  EXPECT_EQ(to_string(Traffic::layer_activations), "layer activations");
}

}  // namespace
}  // namespace distplan
