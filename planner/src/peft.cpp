// Fine-tuning: module names, adapters, quantized storage, counts and the per-layer flow of
// gradients (docs/peft.md).
#include "distplan/planner/peft.h"

#include <algorithm>

#include <fmt/format.h>

#include "distplan/planner/error.h"

namespace distplan {

std::string_view to_string(PeftMethod v) noexcept {
  switch (v) {
    case PeftMethod::none:
      return "none";
    case PeftMethod::full:
      return "full";
    case PeftMethod::lora:
      return "lora";
    case PeftMethod::qlora:
      return "qlora";
  }
  return "?";
}

std::string_view to_string(BaseStorage v) noexcept {
  switch (v) {
    case BaseStorage::fp32:
      return "fp32";
    case BaseStorage::fp16:
      return "fp16";
    case BaseStorage::bf16:
      return "bf16";
    case BaseStorage::nf4:
      return "nf4";
    case BaseStorage::fp4:
      return "fp4";
    case BaseStorage::int8:
      return "int8";
  }
  return "?";
}

std::string_view to_string(PeftNaming v) noexcept {
  switch (v) {
    case PeftNaming::llama:
      return "llama";
    case PeftNaming::gpt2:
      return "gpt2";
    case PeftNaming::gpt_neox:
      return "gpt_neox";
  }
  return "?";
}

namespace {

// Hugging Face transformers' module names: models/llama/modeling_llama.py (LlamaAttention,
// LlamaMLP; Mistral, Qwen2 and Qwen3 alike), models/gpt2/modeling_gpt2.py (GPT2Attention c_attn /
// c_proj, GPT2MLP c_fc / c_proj), models/gpt_neox/modeling_gpt_neox.py (query_key_value, dense,
// dense_h_to_4h, dense_4h_to_h; models/bloom/modeling_bloom.py uses the same names).
constexpr PeftModuleName kLlama[] = {
    {"q_proj", peft_q},       {"k_proj", peft_k},   {"v_proj", peft_v},      {"o_proj", peft_o},
    {"gate_proj", peft_gate}, {"up_proj", peft_up}, {"down_proj", peft_down}};
constexpr PeftModuleName kGpt2[] = {
    {"c_attn", peft_qkv}, {"c_proj", peft_o | peft_down}, {"c_fc", peft_up}};
constexpr PeftModuleName kNeox[] = {{"query_key_value", peft_qkv},
                                    {"dense", peft_o},
                                    {"dense_h_to_4h", peft_up},
                                    {"dense_4h_to_h", peft_down}};

}  // namespace

std::span<const PeftModuleName> peft_module_names(PeftNaming naming) noexcept {
  switch (naming) {
    case PeftNaming::llama:
      return kLlama;
    case PeftNaming::gpt2:
      return kGpt2;
    case PeftNaming::gpt_neox:
      return kNeox;
  }
  return {};
}

PeftNaming default_peft_naming(const ModelSpec& m) noexcept {
  if (gated(m.mlp)) return PeftNaming::llama;
  return m.position_embedding == PositionEmbedding::learned ? PeftNaming::gpt2
                                                            : PeftNaming::gpt_neox;
}

unsigned peft_all_linear_targets(PeftNaming naming, const ModelSpec& m) noexcept {
  unsigned all = 0;
  for (const PeftModuleName& n : peft_module_names(naming)) all |= n.targets;
  if (!gated(m.mlp)) all &= ~static_cast<unsigned>(peft_gate);
  return all;
}

unsigned peft_targets_from_names(PeftNaming naming, const ModelSpec& m,
                                 const std::vector<std::string>& names, std::string_view path) {
  const std::span<const PeftModuleName> known = peft_module_names(naming);
  std::string list;
  for (const PeftModuleName& n : known) {
    if (n.targets == peft_gate && !gated(m.mlp)) continue;
    list += list.empty() ? "" : ", ";
    list += n.name;
  }
  unsigned bits = 0;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string where = fmt::format("{}/{}", path, i);
    const auto it = std::find_if(known.begin(), known.end(),
                                 [&](const PeftModuleName& n) { return n.name == names[i]; });
    if (it == known.end() || (it->targets == peft_gate && !gated(m.mlp))) {
      throw InputError(where, fmt::format("'{}' is not a linear module of a {} layer{} (its "
                                          "modules: {}; or \"all-linear\")",
                                          names[i].substr(0, 64), to_string(naming),
                                          gated(m.mlp) ? "" : " with a GeLU MLP", list));
    }
    bits |= it->targets;
  }
  return bits;
}

std::vector<std::string_view> peft_target_names(PeftNaming naming, unsigned targets) noexcept {
  std::vector<std::string_view> out;
  for (const PeftModuleName& n : peft_module_names(naming)) {
    if ((n.targets & targets) != 0) out.push_back(n.name);
  }
  return out;
}

LoraLayer lora_layer(const LayerTable& table, const ModelSpec& m, const PeftSpec& peft) noexcept {
  LoraLayer out;
  if (!peft.adapters()) return out;
  // The table's linear ops in order: qkv, attention_out, mlp_in, mlp_out (layer_ops.cpp).
  int qkv = -1, attn_out = -1, mlp_in = -1, mlp_out = -1;
  for (int i = 0; i < table.num_ops; ++i) {
    const std::string_view name = table.ops[static_cast<std::size_t>(i)].name;
    if (name == "qkv") qkv = i;
    if (name == "attention_out") attn_out = i;
    if (name == "mlp_in") mlp_in = i;
    if (name == "mlp_out") mlp_out = i;
  }
  const Count h = m.hidden_size, qh = m.q_hidden(), kvh = m.kv_hidden(), f = m.ffn_hidden_size;
  const LoraModule all[] = {{peft_q, qkv, h, qh},      {peft_k, qkv, h, kvh},
                            {peft_v, qkv, h, kvh},     {peft_qkv, qkv, h, qh + 2 * kvh},
                            {peft_o, attn_out, qh, h}, {peft_gate, mlp_in, h, f},
                            {peft_up, mlp_in, h, f},   {peft_down, mlp_out, f, h}};
  for (const LoraModule& x : all) {
    if ((peft.targets & x.target) == 0 || x.op < 0) continue;
    out.modules[static_cast<std::size_t>(out.count++)] = x;
    out.params += x.params(peft.rank);
  }
  return out;
}

LayerTensors layer_weight_tensors(const ModelSpec& m, PeftNaming naming) noexcept {
  LayerTensors t;
  const Count h = m.hidden_size, qh = m.q_hidden(), kvh = m.kv_hidden(), f = m.ffn_hidden_size;
  auto add = [&t](Count in, Count out, unsigned target) {
    t.tensors[static_cast<std::size_t>(t.count++)] = {in, out, target};
  };
  if (naming == PeftNaming::llama) {
    add(h, qh, peft_q);
    add(h, kvh, peft_k);
    add(h, kvh, peft_v);
  } else {
    add(h, qh + 2 * kvh, peft_qkv);
  }
  add(qh, h, peft_o);
  if (gated(m.mlp)) add(h, f, peft_gate);
  add(h, f, peft_up);  // or the GeLU MLP's first linear
  add(f, h, peft_down);
  return t;
}

Bytes storage_element_bytes(BaseStorage s) noexcept {
  switch (s) {
    case BaseStorage::fp32:
      return 4;
    case BaseStorage::fp16:
    case BaseStorage::bf16:
      return 2;
    case BaseStorage::int8:
      return 1;
    case BaseStorage::nf4:
    case BaseStorage::fp4:
      return 0;
  }
  return 0;
}

Bytes stored_weight_bytes(BaseStorage storage, bool double_quant, const WeightTensor& w) noexcept {
  const Count n = w.numel();
  switch (storage) {
    case BaseStorage::nf4:
    case BaseStorage::fp4: {
      const Count blocks = (n + kBnb4bitBlock - 1) / kBnb4bitBlock;
      const Bytes packed = (n + 1) / 2;
      const Bytes absmax = double_quant
                               ? blocks + (blocks + kBnbNestedBlock - 1) / kBnbNestedBlock * 4 + 4
                               : blocks * 4;
      return packed + absmax + kBnb4bitCodeBytes;
    }
    case BaseStorage::int8:
      return n + w.out * 4;
    default:
      return n * storage_element_bytes(storage);
  }
}

bool peft_layer_trains(const PeftSpec& peft, Count layer) noexcept {
  if (!peft.enabled()) return true;
  if (layer < peft.frozen_layers) return false;
  return peft.method == PeftMethod::full || peft.targets != 0;
}

bool peft_embedding_trains(const PeftSpec& peft) noexcept {
  return !peft.enabled() || (peft.method == PeftMethod::full && !peft.freeze_embeddings);
}

bool peft_grad_reaches(const PeftSpec& peft, Count layer) noexcept {
  if (!peft.enabled() || peft.input_requires_grad || peft_embedding_trains(peft)) return true;
  // Only the first frozen_layers layers are frozen: every layer above the first trainable one
  // receives a gradient at its input.
  return layer > peft.frozen_layers;
}

PeftParameterCount peft_parameter_count(const ModelSpec& m, const LayerTable& table,
                                        const PeftSpec& peft, Count base) noexcept {
  PeftParameterCount c;
  const Count adapted = std::max<Count>(0, m.num_layers - peft.frozen_layers);
  if (!peft.enabled()) {
    c.trainable = c.all = base;
    return c;
  }
  if (peft.adapters()) {
    c.adapters = adapted * lora_layer(table, m, peft).params;
    c.trainable = c.adapters;
    c.all = base + c.adapters;
    return c;
  }
  // Full fine-tuning: all but the frozen layers and, with freeze_embeddings, the word and
  // position embeddings (the LM head with them when tied).
  c.all = base;
  Count frozen = peft.frozen_layers * layer_parameters(table);
  if (peft.freeze_embeddings)
    frozen += m.vocab_size * m.hidden_size + m.embedding_extra_parameters();
  c.trainable = base - frozen;
  return c;
}

PeftLayerFlow peft_layer_flow(const LayerTable& table, const LoraLayer& lora, bool own_weights,
                              bool grad_in, bool lora_dropout) noexcept {
  PeftLayerFlow f;
  bool flowing = grad_in;
  for (int i = 0; i < table.num_ops; ++i) {
    const LayerOp& op = table.ops[static_cast<std::size_t>(i)];
    const auto k = static_cast<std::size_t>(i);
    const bool has_params = op.weight_params + op.bias_params > 0;
    const bool trains = own_weights && has_params;
    bool adapted = false;
    for (const LoraModule& x : lora) adapted |= x.op == i;
    f.backward_input[k] = flowing;
    f.backward_weight[k] = trains;
    if (op.kind == OpKind::linear) {
      // The input serves only the weight gradient (dX = dY W needs W alone), and an adapter that
      // reads the input itself (no lora dropout).
      f.saves[k] = trains || (adapted && !lora_dropout);
    } else {
      f.saves[k] = flowing || trains;
    }
    flowing = flowing || trains || adapted;
  }
  f.any = flowing;
  return f;
}

LayerActivation peft_layer_activation(const LayerTable& table, const ModelSpec& m,
                                      const TrainingSpec& training, const LoraLayer& lora,
                                      bool own_weights, bool grad_in, bool sequence_parallel,
                                      Count tp, Recompute recompute) noexcept {
  const PeftSpec& peft = training.peft;
  const bool lora_dropout = peft.dropout > 0;
  const PeftLayerFlow flow = peft_layer_flow(table, lora, own_weights, grad_in, lora_dropout);
  LayerActivation out;
  if (!flow.any) return out;
  const Count b = training.micro_batch_size;
  const Count s = training.seq_length;
  const Bytes cb = bytes_of(training.precision);
  SavedSums sums;
  for (int i = 0; i < table.num_ops; ++i) {
    if (!flow.saves[static_cast<std::size_t>(i)]) continue;
    add_saved_tensors(table.ops[static_cast<std::size_t>(i)], b, s, tp, sequence_parallel, sums);
  }
  Bytes all = sums.all, dropped = sums.dropped;
  Count largest = sums.largest;
  // Flash attention's backward reads its output O (Dao 2023, Algorithm 2: D = rowsum(dO * O));
  // the table counts O as attention_out's saved input, so when that frozen projection keeps
  // nothing, the attention keeps O itself.
  for (int i = 0; i + 1 < table.num_ops; ++i) {
    const LayerOp& op = table.ops[static_cast<std::size_t>(i)];
    const LayerOp& next = table.ops[static_cast<std::size_t>(i + 1)];
    if (op.kind == OpKind::attention_core && training.attention == Attention::flash &&
        flow.saves[static_cast<std::size_t>(i)] && next.kind == OpKind::linear &&
        !flow.saves[static_cast<std::size_t>(i + 1)]) {
      all += b * s * next.in_features * cb / tp;
    }
  }
  // Each adapter: B saves A's output (r per token); with lora dropout A saves its dropped input
  // and the dropout its one-byte mask (torch native_dropout), one per adapter (PEFT gives every
  // LoRA module its own lora_dropout).
  for (const LoraModule& x : lora) {
    all += b * s * peft.rank * cb;
    if (lora_dropout) all += b * s * x.in * (cb + 1);
    largest = std::max(largest, lora_dropout ? b * s * x.in : b * s * peft.rank);
  }
  out.largest_elements = largest;
  switch (recompute) {
    case Recompute::none:
    case Recompute::selective_op:  // refused with fine-tuning (validate.cpp)
      out.kept = all;
      break;
    case Recompute::selective:
      out.kept = all - dropped;
      out.working = dropped;
      break;
    case Recompute::full: {
      // The checkpointed layer keeps its input (Hugging Face gradient checkpointing,
      // torch.utils.checkpoint) and rebuilds the rest in its backward, reusing the kept input as
      // its input norm's saved tensor when that norm keeps one.
      const Bytes in = b * s * m.hidden_size * cb;
      out.kept = sequence_parallel ? in / tp : in;
      out.working = all - (flow.saves[0] ? out.kept : 0);
      break;
    }
  }
  return out;
}

LayerFlops peft_layer_flops(const LayerTable& table, const LoraLayer& lora, Count rank,
                            bool own_weights, bool grad_in, Count micro_batch, Count seq) noexcept {
  const PeftLayerFlow flow = peft_layer_flow(table, lora, own_weights, grad_in, false);
  LayerFlops f;
  const double tokens = static_cast<double>(micro_batch) * static_cast<double>(seq);
  const double r = static_cast<double>(rank);
  for (int i = 0; i < table.num_ops; ++i) {
    const LayerOp& op = table.ops[static_cast<std::size_t>(i)];
    const auto k = static_cast<std::size_t>(i);
    const double fwd = tokens * (op.forward_flops_per_token +
                                 op.forward_flops_per_token_per_key * static_cast<double>(seq));
    f.forward += fwd;
    if (flow.backward_input[k]) f.backward_input += op.backward_input_factor * fwd;
    if (flow.backward_weight[k]) f.backward_weight += op.backward_weight_factor * fwd;
    bool selective = false;
    for (int j = 0; j < op.num_saved; ++j) selective |= op.saved[j].dropped_by_selective;
    if (selective) f.selective_recompute += fwd;
    // The s x s products above the causal diagonal (layer_flops), in the halves the flow runs.
    const double masked =
        0.5 * tokens * op.forward_flops_per_token_per_key * static_cast<double>(seq);
    f.causal_masked_forward += masked;
    f.causal_masked += masked * (1.0 + (flow.backward_input[k] ? op.backward_input_factor : 0.0) +
                                 (flow.backward_weight[k] ? op.backward_weight_factor : 0.0));
    for (const LoraModule& x : lora) {
      if (x.op != i) continue;
      const double in = static_cast<double>(x.in), out = static_cast<double>(x.out);
      f.forward += 2.0 * tokens * r * (in + out);                             // A x, then B (A x)
      f.backward_weight += 2.0 * tokens * r * (in + out);                     // dA, dB
      f.backward_input += 2.0 * tokens * r * out;                             // d(A x) = B^T dy
      if (flow.backward_input[k]) f.backward_input += 2.0 * tokens * r * in;  // A^T d(A x)
    }
  }
  return f;
}

}  // namespace distplan
