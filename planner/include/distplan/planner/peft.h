// Fine-tuning (`training.peft`; docs/peft.md): which parameters are frozen, where LoRA adapters
// sit, how a frozen base is stored (bitsandbytes NF4 / FP4 / int8), and what a layer saves and
// computes when only some of its parameters train. One definition here, used by the planner's
// memory, FLOPs, op costs and collectives, the search and the training backend alike.
//
// Dimension letters as layer_ops.h: h hidden, qh = a * head_dim, kvh = kv * head_dim, f ffn,
// r the LoRA rank, T tokens of a micro-batch on one GPU.
#pragma once

#include <array>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "distplan/planner/layer_ops.h"
#include "distplan/planner/memory_terms.h"
#include "distplan/planner/spec.h"
#include "distplan/planner/units.h"

namespace distplan {

[[nodiscard]] std::string_view to_string(PeftMethod v) noexcept;
[[nodiscard]] std::string_view to_string(BaseStorage v) noexcept;
[[nodiscard]] std::string_view to_string(PeftNaming v) noexcept;

/// A Hugging Face module name of a family and the targets it stands for. PEFT matches a
/// target_modules entry against a module's full name or its last component (peft/tuners/
/// tuners_utils.py, check_target_module_exists), so GPT-2's "c_proj" matches both the attention's
/// and the MLP's output projection.
struct PeftModuleName {
  std::string_view name;
  unsigned targets = 0;  // PeftTarget bits
};
[[nodiscard]] std::span<const PeftModuleName> peft_module_names(PeftNaming naming) noexcept;
/// The family whose names a model's structure implies: SwiGLU -> llama; GeLU with learned
/// positions -> gpt2 (GPT-3 is GPT-2's architecture, Brown et al. 2020 sec. 2.1); GeLU with rotary
/// or ALiBi -> gpt_neox (BLOOM uses the same names). `training.peft.module_names` overrides it.
[[nodiscard]] PeftNaming default_peft_naming(const ModelSpec& m) noexcept;
/// What `all-linear` selects: every linear module of a layer (PEFT's
/// _maybe_include_all_linear_layers: nn.Linear and Conv1D, the output embedding excluded).
[[nodiscard]] unsigned peft_all_linear_targets(PeftNaming naming, const ModelSpec& m) noexcept;
/// Reads target_modules names into bits; an unknown name or one the model lacks (gate_proj of a
/// GeLU MLP) throws InputError at `path` (the entry) listing the family's names.
[[nodiscard]] unsigned peft_targets_from_names(PeftNaming naming, const ModelSpec& m,
                                               const std::vector<std::string>& names,
                                               std::string_view path);
/// The Hugging Face names of `targets` in a family, in the family's order (exports).
[[nodiscard]] std::vector<std::string_view> peft_target_names(PeftNaming naming,
                                                              unsigned targets) noexcept;

/// One LoRA adapter of a layer (Hu et al. 2021, sec. 4.1): A (r x in) and B (out x r) beside the
/// frozen W (out x in) of layer-table op `op`; y = W x + (alpha / r) B A dropout(x).
struct LoraModule {
  unsigned target = 0;  // its PeftTarget bit
  int op = -1;          // index of the linear op in the layer table
  Count in = 0, out = 0;
  [[nodiscard]] Count params(Count rank) const noexcept { return rank * (in + out); }
};
inline constexpr int kMaxLoraModules = 8;
struct LoraLayer {
  std::array<LoraModule, kMaxLoraModules> modules{};
  int count = 0;
  Count params = 0;  // all adapters of one layer
  [[nodiscard]] const LoraModule* begin() const noexcept { return modules.data(); }
  [[nodiscard]] const LoraModule* end() const noexcept { return modules.data() + count; }
};
/// The adapters one adapted layer carries (empty without adapters).
[[nodiscard]] LoraLayer lora_layer(const LayerTable& table, const ModelSpec& m,
                                   const PeftSpec& peft) noexcept;

/// The linear weight tensors of one layer as the Hugging Face model holds them (separate q, k, v
/// for llama; fused for gpt2 / gpt_neox): what bitsandbytes quantizes one by one.
struct WeightTensor {
  Count in = 0, out = 0;
  unsigned target = 0;  // the PeftTarget bit of its module (peft_qkv for a fused q/k/v)
  [[nodiscard]] Count numel() const noexcept { return in * out; }
};
inline constexpr int kMaxLayerTensors = 8;
struct LayerTensors {
  std::array<WeightTensor, kMaxLayerTensors> tensors{};
  int count = 0;
  [[nodiscard]] const WeightTensor* begin() const noexcept { return tensors.data(); }
  [[nodiscard]] const WeightTensor* end() const noexcept { return tensors.data() + count; }
};
[[nodiscard]] LayerTensors layer_weight_tensors(const ModelSpec& m, PeftNaming naming) noexcept;

/// bitsandbytes' storage of one weight tensor of `in` x `out` (docs/peft.md, "Quantized base"):
/// - nf4 / fp4 (functional.py quantize_4bit, nn/modules.py Params4bit, v0.49): two values per
///   byte, ceil(n / 64) blocks each with an fp32 absmax, and the 16-value fp32 code table
///   (get_4bit_type, one per tensor). Double quantization (compress_statistics) stores each
///   absmax as one byte (quantize_blockwise, blocks of 256 with an fp32 absmax each) plus the
///   fp32 offset (the mean subtracted first); the 256-entry dynamic code is shared per device.
/// - int8 (Int8Params, int8_vectorwise_quant): one byte per value and an fp32 scale per row.
/// - a float dtype: its bytes per value.
[[nodiscard]] Bytes stored_weight_bytes(BaseStorage storage, bool double_quant,
                                        const WeightTensor& w) noexcept;
inline constexpr Count kBnb4bitBlock = 64;           // Params4bit blocksize default
inline constexpr Count kBnbNestedBlock = 256;        // quantize_4bit: quantize_blockwise(..., 256)
inline constexpr Bytes kBnb4bitCodeBytes = 64;       // 16 fp32 values per quantized tensor
inline constexpr Bytes kBnbDynamicCodeBytes = 1024;  // 256 fp32 values, once per device

/// Bytes of one element of a float dtype, or of a storage (nf4/fp4: 0.5 rounded up per tensor;
/// here only for float storages).
[[nodiscard]] Bytes storage_element_bytes(BaseStorage s) noexcept;

/// Parameter counts as PEFT prints them (peft_model.py, get_nb_trainable_parameters): `all`
/// counts the base and the adapters, a Params4bit weight as its unpacked element count
/// (numel * 2 * element_size), so quantization does not change it; `trainable` counts what
/// requires grad.
struct PeftParameterCount {
  Count trainable = 0;
  Count all = 0;
  Count adapters = 0;  // LoRA parameters (of `all`)
};
/// `base` is the model's own parameter count (model_parameters()).
[[nodiscard]] PeftParameterCount peft_parameter_count(const ModelSpec& m, const LayerTable& table,
                                                      const PeftSpec& peft, Count base) noexcept;

/// Whether layer `layer` trains anything (adapters, or its own weights under full).
[[nodiscard]] bool peft_layer_trains(const PeftSpec& peft, Count layer) noexcept;
/// Whether the word embedding trains (full fine-tuning without freeze_embeddings).
[[nodiscard]] bool peft_embedding_trains(const PeftSpec& peft) noexcept;
/// Whether gradients reach layer `layer`'s input from below: some earlier layer or the
/// embedding trains, or the embedding output is made to require grad.
[[nodiscard]] bool peft_grad_reaches(const PeftSpec& peft, Count layer) noexcept;

/// Which ops of one layer run which backward half, and what they save, given whether the
/// gradient reaches the layer's input (docs/peft.md, "What a layer saves"). PyTorch saves an
/// op's input for the weight gradient only when the weight requires grad (autograd codegen,
/// tools/autograd/gen_variable_type.py guard_for / should_compute_output), and bitsandbytes'
/// MatMul4Bit saves only the packed weight; an op whose inputs do not require grad builds no graph.
struct PeftLayerFlow {
  std::array<bool, kMaxLayerOps> backward_input{};   // the op's input gradient is needed
  std::array<bool, kMaxLayerOps> backward_weight{};  // the op's own weights train
  std::array<bool, kMaxLayerOps> saves{};            // the op keeps its saved tensors
  bool any = false;                                  // the layer has a backward at all
};
/// `own_weights`: the layer's own parameters train (full fine-tuning); `lora`: its adapters;
/// `lora_dropout`: adapters read a dropped copy of their input, not the input itself.
[[nodiscard]] PeftLayerFlow peft_layer_flow(const LayerTable& table, const LoraLayer& lora,
                                            bool own_weights, bool grad_in,
                                            bool lora_dropout) noexcept;

/// Activation bytes of one layer for one micro-batch on one GPU under fine-tuning (tp = 1), as
/// layer_activation() for full training: the table's saved tensors the flow keeps, plus each
/// adapter's A output (r per token; B's input) and, with lora dropout, its dropped input and
/// one-byte mask. `training` holds the local tokens.
[[nodiscard]] LayerActivation peft_layer_activation(const LayerTable& table, const ModelSpec& m,
                                                    const TrainingSpec& training,
                                                    const LoraLayer& lora, bool own_weights,
                                                    bool grad_in, bool sequence_parallel, Count tp,
                                                    Recompute recompute) noexcept;

/// Matmul FLOPs of one layer for one micro-batch (all of it, tp = 1): the flow's halves of the
/// table's ops plus the adapters' GEMMs (forward 2r(in + out) per token; backward dB, dA and B's
/// input gradient always, A's input gradient when the gradient goes on).
[[nodiscard]] LayerFlops peft_layer_flops(const LayerTable& table, const LoraLayer& lora,
                                          Count rank, bool own_weights, bool grad_in,
                                          Count micro_batch, Count seq) noexcept;

/// The parameter units of one stage split into what trains and what stays frozen, with the
/// bytes per element of what trains (docs/peft.md, "Memory"): one definition for the memory
/// terms, the collectives and the optimizer's time. ZeRO shards each unit's trainable part and,
/// at stage 3, its frozen part too (FSDP and DeepSpeed ZeRO-3 partition frozen parameters as
/// well; PEFT's FSDP-QLoRA recipe stores the packed 4-bit values in a 16-bit quant_storage so
/// FSDP can shard them, and each weight's quantization state, not a parameter, stays whole on
/// every rank).
struct PeftUnit {
  Count trainable = 0;       // parameters that train, per TP rank
  Count frozen = 0;          // frozen parameters held in one float dtype, per TP rank
  Bytes frozen_element = 0;  // their bytes per element
  Bytes packed = 0;          // frozen weights in a quantized (or second float) storage, bytes
  Bytes quant_state = 0;     // quantization state of the packed weights (absmax, codes)
  [[nodiscard]] Bytes frozen_bytes() const noexcept { return frozen * frozen_element + packed; }
  /// The frozen part on one GPU: ZeRO pads a unit's float part to a multiple of the shard group S
  /// (as it pads the trainable part) and ZeRO-3 keeps 1/S of it and of the packed bytes.
  [[nodiscard]] Bytes frozen_held(int zero_stage, Count S) const noexcept {
    if (zero_stage == 0) return frozen_bytes() + quant_state;
    const Count padded = (frozen + S - 1) / S * S;
    if (zero_stage < 3) return padded * frozen_element + packed + quant_state;
    return padded / S * frozen_element + (packed + S - 1) / S + quant_state;
  }
  /// What a ZeRO-3 gather of the frozen part moves (the padded unit, its state excluded).
  [[nodiscard]] Bytes frozen_gathered(Count S) const noexcept {
    return (frozen + S - 1) / S * S * frozen_element + (packed + S - 1) / S * S;
  }
};
struct PeftUnits {
  PeftUnit frozen_layer, trained_layer, embedding, head;
  Count frozen_layers = 0, trained_layers = 0;  // of the stage's layers
  bool head_matrix_trains = false;
  Bytes weight = 2, gradient = 2, optimizer = 12;  // bytes per trainable parameter
  LoraLayer lora;
};
[[nodiscard]] PeftUnits peft_units(const Scenario& s, const LayerTable& table, Count tp,
                                   int zero_stage, const StageUnitParams& u) noexcept;

}  // namespace distplan
