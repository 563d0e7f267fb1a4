// Presets compiled in from data/models/*.json and data/gpus/*.json (cmake/EmbedData.cmake).
#include "distplan/planner/presets.h"

#include <algorithm>
#include <span>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "distplan/planner/check.h"
#include "distplan/planner/error.h"
#include "distplan/planner/suggest.h"
#include "json_reader.h"

namespace distplan::data {
std::span<const std::pair<std::string_view, std::string_view>> EmbeddedFiles();
}

namespace distplan {
namespace {

template <typename Spec>
struct Preset {
  PresetInfo info;
  Spec spec;
};

struct Registry {
  std::vector<Preset<ModelSpec>> models;
  std::vector<Preset<GpuSpec>> gpus;
};

// Preset files are part of the build: one that does not parse is a build defect, reported with
// the file's name so it is found at once (a test loads every preset).
const Registry& registry() {
  static const Registry r = [] {
    Registry out;
    for (const auto& [path, text] : data::EmbeddedFiles()) {
      const bool model = path.starts_with("models/");
      const bool gpu = path.starts_with("gpus/");
      if (!model && !gpu) continue;
      const std::string where = fmt::format("data/{}", path);
      try {
        const nlohmann::json j = nlohmann::json::parse(text);
        detail::ObjectReader r(j, "");
        PresetInfo info;
        info.name = r.string("name").value_or("");
        info.description = r.string("description").value_or("");
        info.source = r.string("source").value_or("");
        if (info.name.empty() || info.source.empty()) {
          throw InputError("", "a preset needs a name and a source");
        }
        if (model) {
          const nlohmann::json* m = r.take("model");
          if (!m) throw InputError("/model", "missing");
          ModelSpec spec = detail::read_model(*m, "/model");
          spec.name = info.name;
          r.finish();
          out.models.push_back({std::move(info), std::move(spec)});
        } else {
          const nlohmann::json* g = r.take("gpu");
          if (!g) throw InputError("/gpu", "missing");
          GpuSpec spec = detail::read_gpu(*g, "/gpu");
          spec.name = info.name;
          if (auto n = r.integer("gpus_per_node", 1, 1024)) spec.gpus_per_node = *n;
          r.finish();
          out.gpus.push_back({std::move(info), std::move(spec)});
        }
      } catch (const InputError& e) {
        DISTPLAN_CHECK(false,
                       fmt::format("bad preset {} at '{}': {}", where, e.path(), e.what()).c_str());
      } catch (const std::exception& e) {
        DISTPLAN_CHECK(false, fmt::format("bad preset {}: {}", where, e.what()).c_str());
      }
    }
    return out;
  }();
  return r;
}

template <typename Spec>
std::vector<PresetInfo> infos(const std::vector<Preset<Spec>>& v) {
  std::vector<PresetInfo> out;
  for (const auto& p : v) out.push_back(p.info);
  return out;
}

}  // namespace

std::vector<PresetInfo> model_presets() {
  return infos(registry().models);
}
std::vector<PresetInfo> gpu_presets() {
  return infos(registry().gpus);
}

std::optional<ModelSpec> find_model_preset(std::string_view name) {
  for (const auto& p : registry().models) {
    if (p.info.name == name) return p.spec;
  }
  // Preset names are lower case; `A100-80GB` means `a100-80gb`.
  for (const auto& p : registry().models) {
    if (iequals(p.info.name, name)) return p.spec;
  }
  return std::nullopt;
}

std::optional<GpuSpec> find_gpu_preset(std::string_view name) {
  for (const auto& p : registry().gpus) {
    if (p.info.name == name) return p.spec;
  }
  // Preset names are lower case; `A100-80GB` means `a100-80gb`.
  for (const auto& p : registry().gpus) {
    if (iequals(p.info.name, name)) return p.spec;
  }
  return std::nullopt;
}

std::optional<std::string_view> embedded_data_file(std::string_view relative_path) {
  for (const auto& [path, text] : data::EmbeddedFiles()) {
    if (path == relative_path) return text;
  }
  return std::nullopt;
}

std::string_view default_scenario_text() {
  const auto text = embedded_data_file("scenarios/default.json");
  DISTPLAN_CHECK(text.has_value(), "data/scenarios/default.json is not compiled in");
  return *text;
}

}  // namespace distplan
