// JSON of the attention-variant model fields (docs/scenario.md; docs/layer_ops.md, "Attention
// variants"): attention_window, attention_sinks, the softcaps and sandwich_norm. Private to the
// planner library.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "distplan/planner/spec.h"
#include "json_reader.h"

namespace distplan::detail {

/// Reads the attention-variant fields present in `r` over `m`.
void read_attention_fields(ObjectReader& r, ModelSpec& m);
/// Checks them against the rest of the model; `path` is the model's.
void check_attention_fields(const ModelSpec& m, const std::string& path);
/// Adds the fields that differ from the defaults to an echoed model object.
void put_attention_fields(const ModelSpec& m, nlohmann::json& j);

/// Maps the attention variants of a config.json family onto `m` (docs/scenario.md): the
/// window (sliding_window, attention_chunk_size, and which layers from layer_types or the
/// family's rule), sinks (gpt-oss), softcaps and the four norms a layer (Gemma 2/3). Refuses
/// at the field what distplan does not model (a layer type other than full, sliding or chunked).
void map_hf_attention(const nlohmann::json& cfg, const std::string& path,
                      std::string_view model_type, ModelSpec& m);

}  // namespace distplan::detail
