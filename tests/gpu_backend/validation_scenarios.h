// The validation-report tests' scenario: a 4-layer GPT of hidden size 64 over pp = 2 stages, 1F1B,
// small enough that every figure can be worked out by hand.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "distplan/planner/scenario_json.h"

namespace distplan::backend::testing {

/// `dp` pipelines of 4 micro-batches each, in `precision`, under `framework` (generic: the
/// textbook conventions the backend trains by).
inline Scenario two_stage_gpt(Count dp, const char* precision,
                              const std::string& framework = "generic") {
  nlohmann::json doc = {
      {"model",
       {{"num_layers", 4},
        {"hidden_size", 64},
        {"num_attention_heads", 4},
        {"ffn_hidden_size", 256},
        {"vocab_size", 512},
        {"max_position_embeddings", 32}}},
      {"cluster", {{"gpu", "h100-sxm-80gb"}, {"num_gpus", 2 * dp}, {"gpus_per_node", 8}}},
      {"training",
       {{"seq_length", 32},
        {"global_batch_size", 4 * dp},
        {"micro_batch_size", 1},
        {"precision", precision}}},
      {"parallel", {{"tp", 1}, {"pp", 2}, {"dp", dp}, {"schedule", "1f1b"}}}};
  doc["training"]["framework"] = framework.empty() ? std::string("generic") : framework;
  return scenario_from_json(doc);
}

}  // namespace distplan::backend::testing
