// Model and GPU presets shipped in data/ (compiled in). Each preset file cites its source.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "distplan/planner/spec.h"

namespace distplan {

struct PresetInfo {
  std::string name;
  std::string description;
  std::string source;
};

[[nodiscard]] std::vector<PresetInfo> model_presets();
[[nodiscard]] std::vector<PresetInfo> gpu_presets();
/// The preset's model or GPU; nullopt when no preset has that name.
[[nodiscard]] std::optional<ModelSpec> find_model_preset(std::string_view name);
[[nodiscard]] std::optional<GpuSpec> find_gpu_preset(std::string_view name);

/// Text of a file under data/ compiled into the binary (e.g. "scenarios/default.json").
[[nodiscard]] std::optional<std::string_view> embedded_data_file(std::string_view relative_path);

/// The embedded default scenario: Llama-2-70B on 64 x H100-SXM-80GB.
[[nodiscard]] std::string_view default_scenario_text();

}  // namespace distplan
