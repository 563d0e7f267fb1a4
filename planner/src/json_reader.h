// The scenario and preset parsers' readers of models, GPUs and framework profiles, over the strict
// object reader (distplan/planner/object_reader.h).
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "distplan/planner/object_reader.h"
#include "distplan/planner/spec.h"
#include "distplan/planner/units.h"

namespace distplan::detail {

/// A model: a preset name, or an object (fields, optionally over a `preset` or `hf_config`).
ModelSpec read_model(const nlohmann::json& doc, const std::string& path);
/// A GPU: a preset name, or an object (fields, optionally over a `preset`).
GpuSpec read_gpu(const nlohmann::json& doc, const std::string& path);

/// "; ... lists are for `distplan search`" when `v` is an array, else "".
std::string list_hint(const nlohmann::json& v);

/// assumptions.framework_profile: fields present override `p` (framework.cpp).
void read_framework_profile(const nlohmann::json& doc, const std::string& path,
                            FrameworkProfile& p);
nlohmann::json framework_profile_json(const FrameworkProfile& p);

}  // namespace distplan::detail
