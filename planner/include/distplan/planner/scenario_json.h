// JSON (de)serialisation of scenarios and estimates. Kept apart from the value types so the core
// headers never include nlohmann/json. Parsing is strict: unknown fields, wrong types and
// out-of-range values throw InputError naming the JSON pointer of the field.
#pragma once

#include <initializer_list>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "distplan/planner/estimate.h"
#include "distplan/planner/spec.h"

namespace distplan {

/// Parses a JSON document; malformed text throws InputError at path "".
[[nodiscard]] nlohmann::json parse_json_text(std::string_view text);
/// The deepest nesting of arrays and objects any distplan document has room for (a scenario
/// nests about 5 deep, a validation result about 8); parse_json_text and the Python reader
/// refuse deeper documents at the container that holds the first too-deep one.
inline constexpr int kMaxJsonDepth = 64;

/// Builds a scenario from a document (`model`, `cluster`, `training`, `parallel`, `assumptions`),
/// fills defaults and validates it. Top-level keys in `extra_keys` are left to the caller
/// (e.g. "costs" for simulate, "search" for search); any other unknown key is an error.
[[nodiscard]] Scenario scenario_from_json(const nlohmann::json& doc,
                                          std::initializer_list<std::string_view> extra_keys = {});

/// scenario_from_json for the training backend: a model whose parameters distplan counts but
/// whose memory, communication and time it does not yet plan (validate.h) is accepted, so the
/// backend can train it (docs/gpu_backend.md, "Mixture of Experts"). Everything else is
/// validated as scenario_from_json does.
[[nodiscard]] Scenario scenario_for_training(
    const nlohmann::json& doc, std::initializer_list<std::string_view> extra_keys = {});

/// parse_json_text + scenario_from_json, for callers that hold text (no JSON types needed).
[[nodiscard]] Scenario scenario_from_text(std::string_view text,
                                          std::initializer_list<std::string_view> extra_keys = {});

/// The embedded default scenario (Llama-2-70B on 64 x H100-SXM-80GB), parsed.
[[nodiscard]] Scenario default_scenario();

/// Maps a Hugging Face config.json (Llama, Mistral, Qwen2, Qwen3, GPT-2, GPT-NeoX, Mixtral,
/// Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3) to a model.
/// `path` is where the object sits in the input document, for error messages.
[[nodiscard]] ModelSpec model_from_hf_config(const nlohmann::json& cfg, std::string_view path);
/// Reads a scenario's `model` member (a preset name or an object) on its own: the fields are
/// checked, but not against a training or layout (scenario_from_json does that).
[[nodiscard]] ModelSpec model_from_json(const nlohmann::json& doc, std::string_view path);

/// The scenario with every default filled in (the `scenario` echoed by every command).
[[nodiscard]] nlohmann::json to_json(const Scenario& s);
[[nodiscard]] nlohmann::json to_json(const ModelSpec& m);
[[nodiscard]] nlohmann::json to_json(const GpuSpec& g);
[[nodiscard]] nlohmann::json to_json(const ParallelSpec& p);

/// The top-level parts of a plan document, for callers that need only some (sweeps).
enum PlanPart : unsigned {
  plan_schema = 1u << 0,         // "schema"
  plan_scenario = 1u << 1,       // "scenario"
  plan_model_summary = 1u << 2,  // "model_summary"
  plan_memory = 1u << 3,         // "memory"
  plan_communication = 1u << 4,  // "communication"
  plan_compute = 1u << 5,        // "compute"
  plan_stage_costs = 1u << 6,    // "stage_costs"
  plan_time = 1u << 7,           // "time"
  plan_all = (1u << 8) - 1,
};
/// The part named `name` ("memory", ...), or 0 when no part has that name.
[[nodiscard]] unsigned plan_part(std::string_view name) noexcept;

/// The `distplan.plan/v1` document; with `parts`, only those top-level members of it.
struct ThroughputInterval;  // interval.h

/// A throughput prediction interval (interval.h) as `{"low", "high", "confidence", "kind",
/// "pooled", "runs"}`: `distplan plan` puts it under `time.tokens_per_second_interval`, `distplan
/// search` on each plan.
[[nodiscard]] nlohmann::json interval_to_json(const ThroughputInterval& ti);

[[nodiscard]] nlohmann::json plan_to_json(const Scenario& s, const Estimate& e,
                                          unsigned parts = plan_all);

/// The `distplan.presets/v1` document: every model and GPU preset with its description and source.
[[nodiscard]] nlohmann::json presets_to_json();

}  // namespace distplan
