// What a collective moves: the purpose in a collective's identity (group x op x traffic). The
// planner's collective list (estimate.h), the training backend's communication log (comm.h) and
// validation's per-collective comparison key on it; the names are for display and reports only
// (docs/communication.md lists them).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace distplan {

/// A parameter unit: what a data-parallel collective reduces or gathers at once (ZeRO's unit).
/// The order is the training backend's unit kinds.
enum class ParamUnit : std::uint8_t { layers, embedding, head, experts, adapters };
inline constexpr int kParamUnits = 5;

/// The data-parallel traffic of a unit: its gradients reduced, its parameters gathered after the
/// optimizer step (ZeRO-1/2), gathered for forward and backward or forward only (ZeRO-3), and
/// its sequence-parallel gradients all-reduced over the TP group.
enum class UnitTraffic : std::uint8_t {
  gradients,
  parameters,
  gather_forward_backward,
  gather_forward,
  sp_gradients
};
inline constexpr int kUnitTraffics = 5;

enum class Traffic : std::uint8_t {
  // kUnitTraffics x kParamUnits values, UnitTraffic-major (unit_traffic() below).
  unit_first = 0,
  unit_last = kUnitTraffics * kParamUnits - 1,
  // Tensor parallel (Korthikanti et al. 2022, sec. 4.2.2).
  layer_activations,
  attention_latents,  // MLA: the query and key/value latents on the attention block's input side
  embedding_output,
  embedding_output_gradient,
  head_input,
  head_input_gradient,
  cross_entropy_statistics,
  pipeline_receives,  // scatter/gather of a pipeline receive over the TP group
  // Context parallel.
  cp_ring_kv,
  cp_ring_kv_gradients,
  cp_kv,
  cp_kv_gradients,
  cp_a2a_queries_outputs,
  cp_a2a_kv,
  // Expert parallel: Megatron-Core's token dispatcher.
  dispatch_forward,
  combine_forward,
  combine_backward,
  dispatch_backward,
  expert_tokens_forward,
  expert_outputs_forward,
  expert_output_gradients_backward,
  expert_token_gradients_backward,
  // Pipeline.
  activations_forward,
  gradients_backward,
  mirror_gradients,  // DualPipe: the two copies of a model stage sum their gradients
  tied_embedding_gradients,
  mtp_embedding_gradients,
  // Tests and probes of the communicators only; the planner never plans it.
  probe,
};
inline constexpr int kTraffics = static_cast<int>(Traffic::probe) + 1;

/// The traffic of `kind` for unit `u`.
[[nodiscard]] constexpr Traffic unit_traffic(UnitTraffic kind, ParamUnit u) noexcept {
  return static_cast<Traffic>(static_cast<int>(kind) * kParamUnits + static_cast<int>(u));
}

/// The display name ("gradients (layers)", "activations (forward)"): what reports print and the
/// validation JSON holds.
[[nodiscard]] std::string_view to_string(Traffic t) noexcept;
/// The traffic a display name names (reading a validation report); nullopt for none.
[[nodiscard]] std::optional<Traffic> traffic_from_string(std::string_view name) noexcept;

}  // namespace distplan
