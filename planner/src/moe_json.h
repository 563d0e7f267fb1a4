// JSON of the MoE and MLA model fields (docs/api.md, "model.moe", "model.mla") and their
// Hugging Face config.json mapping (docs/scenario.md). Private to the planner library.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "distplan/planner/spec.h"
#include "json_reader.h"

namespace distplan::detail {

/// Reads head_dim, qk_norm, moe, mla and mtp_layers present in `r` over `m`.
void read_moe_mla_fields(ObjectReader& r, ModelSpec& m);
/// Checks the fields read together (top_k <= num_experts, ...); `path` is the model's.
void check_moe_mla_fields(const ModelSpec& m, const std::string& path);
/// Refuses to plan what the memory, communication and time models do not cover yet (MLA, MTP
/// modules, dense layers mixed with MoE layers, and the MoE layouts moe_layer.h does not plan),
/// at the field, giving the parameter counts.
void refuse_unplanned_model(const Scenario& s);
/// Adds the fields that differ from a dense model's defaults to an echoed model object.
void put_moe_mla_fields(const ModelSpec& m, nlohmann::json& j);

/// Whether the config.json family `model_type` maps `key` (a MoE or MLA field).
[[nodiscard]] bool hf_family_maps(std::string_view model_type, std::string_view key) noexcept;
/// Whether the family maps rope_scaling type "yarn" (DeepSeek: it changes no shape).
[[nodiscard]] bool hf_family_accepts_yarn(std::string_view model_type) noexcept;
/// Maps head_dim, q/k norms, experts, MLA and MTP of the families that have them onto `m`;
/// refuses at the field what distplan does not model (mlp_only_layers, a sparse step > 1, ...).
void map_hf_moe_mla(const nlohmann::json& cfg, const std::string& path, std::string_view model_type,
                    ModelSpec& m);

}  // namespace distplan::detail
