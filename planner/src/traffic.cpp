// Display names of the traffic ids (traffic.h).
#include "distplan/planner/traffic.h"

#include <array>

namespace distplan {

namespace {

constexpr std::array<std::string_view, kTraffics> make_names() {
  // Written out, not concatenated: the names are string literals that live for the program.
  constexpr std::string_view per_unit[kUnitTraffics][kParamUnits] = {
      {"gradients (layers)", "gradients (embedding)", "gradients (lm head)", "gradients (experts)",
       "gradients (adapters)"},
      {"parameters (layers)", "parameters (embedding)", "parameters (lm head)",
       "parameters (experts)", "parameters (adapters)"},
      {"parameters (layers, forward+backward)", "parameters (embedding, forward+backward)",
       "parameters (lm head, forward+backward)", "parameters (experts, forward+backward)",
       "parameters (adapters, forward+backward)"},
      {"parameters (layers, forward)", "parameters (embedding, forward)",
       "parameters (lm head, forward)", "parameters (experts, forward)",
       "parameters (adapters, forward)"},
      {"sequence-parallel gradients (layers)", "sequence-parallel gradients (embedding)",
       "sequence-parallel gradients (lm head)", "sequence-parallel gradients (experts)",
       "sequence-parallel gradients (adapters)"}};
  std::array<std::string_view, kTraffics> n{};
  for (int k = 0; k < kUnitTraffics; ++k)
    for (int u = 0; u < kParamUnits; ++u)
      n[static_cast<std::size_t>(k * kParamUnits + u)] = per_unit[k][u];
  auto at = [&n](Traffic t) -> std::string_view& { return n[static_cast<std::size_t>(t)]; };
  at(Traffic::layer_activations) = "layer activations";
  at(Traffic::attention_latents) = "attention latents (MLA)";
  at(Traffic::embedding_output) = "embedding output";
  at(Traffic::embedding_output_gradient) = "embedding output gradient";
  at(Traffic::head_input) = "lm head input";
  at(Traffic::head_input_gradient) = "lm head input gradient";
  at(Traffic::cross_entropy_statistics) = "cross-entropy statistics";
  at(Traffic::pipeline_receives) = "pipeline receives (scatter/gather)";
  at(Traffic::cp_ring_kv) = "cp ring: keys and values";
  at(Traffic::cp_ring_kv_gradients) = "cp ring: key and value gradients";
  at(Traffic::cp_kv) = "cp: keys and values";
  at(Traffic::cp_kv_gradients) = "cp: key and value gradients";
  at(Traffic::cp_a2a_queries_outputs) = "cp all-to-all: queries and outputs";
  at(Traffic::cp_a2a_kv) = "cp all-to-all: keys and values";
  at(Traffic::dispatch_forward) = "dispatch (forward)";
  at(Traffic::combine_forward) = "combine (forward)";
  at(Traffic::combine_backward) = "combine (backward)";
  at(Traffic::dispatch_backward) = "dispatch (backward)";
  at(Traffic::expert_tokens_forward) = "expert tokens (forward)";
  at(Traffic::expert_outputs_forward) = "expert outputs (forward)";
  at(Traffic::expert_output_gradients_backward) = "expert output gradients (backward)";
  at(Traffic::expert_token_gradients_backward) = "expert token gradients (backward)";
  at(Traffic::activations_forward) = "activations (forward)";
  at(Traffic::gradients_backward) = "gradients (backward)";
  at(Traffic::mirror_gradients) = "mirror stage gradients (DualPipe)";
  at(Traffic::tied_embedding_gradients) = "tied embedding gradients";
  at(Traffic::mtp_embedding_gradients) = "MTP embedding gradients";
  at(Traffic::probe) = "probe";
  return n;
}

constexpr std::array<std::string_view, kTraffics> kNames = make_names();

// Every id has its own non-empty name (checked when this file compiles).
constexpr bool names_complete() {
  for (std::size_t i = 0; i < kNames.size(); ++i) {
    if (kNames[i].empty()) return false;
    for (std::size_t j = 0; j < i; ++j)
      if (kNames[i] == kNames[j]) return false;
  }
  return true;
}
static_assert(names_complete(), "every Traffic needs its own display name");

}  // namespace

std::string_view to_string(Traffic t) noexcept {
  const auto i = static_cast<std::size_t>(t);
  return i < kNames.size() ? kNames[i] : std::string_view("?");
}

std::optional<Traffic> traffic_from_string(std::string_view name) noexcept {
  for (std::size_t i = 0; i < kNames.size(); ++i)
    if (kNames[i] == name) return static_cast<Traffic>(i);
  return std::nullopt;
}

}  // namespace distplan
