// Memory of one pipeline stage under fine-tuning (docs/peft.md, "Memory"): stage_memory()'s
// categories when only adapters, or only some layers, train.
#include <algorithm>

#include "distplan/planner/memory_terms.h"
#include "distplan/planner/moe_layer.h"
#include "distplan/planner/peft.h"

namespace distplan {

using detail::ceil_div;

PeftUnits peft_units(const Scenario& s, const LayerTable& table, Count tp, int zero_stage,
                     const StageUnitParams& u) noexcept {
  const ModelSpec& m = s.model;
  const TrainingSpec& t = s.training;
  const PeftSpec& peft = t.peft;
  const FrameworkProfile& fw = s.assumptions.framework_profile;
  const Bytes cb = bytes_of(t.precision);
  const bool adapters = peft.adapters();
  PeftUnits x;
  x.lora = lora_layer(table, m, peft);
  // Layers of the stage that train: those at or above frozen_layers (contiguous when v = 1;
  // validation keeps frozen_layers at 0 under virtual stages).
  const Count end = u.first_layer + u.layers;
  x.trained_layers =
      u.layers == 0 ? 0 : std::max<Count>(0, end - std::max(u.first_layer, peft.frozen_layers));
  x.frozen_layers = u.layers - x.trained_layers;
  // Bytes per element of what trains: adapters in adapter_dtype (fp32 by PEFT's default, no
  // separate master copy; 16-bit adapters take the scenario's mixed-precision master and
  // states), full fine-tuning as pre-training.
  x.weight = cb;
  x.gradient = bytes_of(t.grad_accumulation_dtype);
  x.optimizer = optimizer_bytes_per_param(t);
  if (adapters) {
    TrainingSpec a = t;
    a.precision = peft.adapter_dtype;
    x.weight = bytes_of(peft.adapter_dtype);
    if (peft.adapter_dtype == DType::fp32) x.gradient = 4;
    x.optimizer = optimizer_bytes_per_param(a);
  }
  if (fw.sharded_params_are_master && zero_stage >= 3 && x.weight < 4) {
    // FSDP2: the sharded fp32 parameters are the master weights (memory_terms.h).
    x.weight = 4;
    x.optimizer -= 4;
  }
  Count linear = 0;  // linear weights of one layer per TP rank
  for (const LayerOp& op : table) {
    if (op.kind == OpKind::linear) linear += op.weight_params / tp;
  }
  const Count other = u.layer - linear;  // norms and biases
  const Bytes base_b = adapters ? bytes_of(peft.base_dtype) : cb;
  Bytes lin = 0, state = 0;
  if (peft.quantized()) {
    for (const WeightTensor& w : layer_weight_tensors(m, peft.naming)) {
      const Bytes all = stored_weight_bytes(peft.base_storage, peft.double_quant, w);
      const Bytes values = peft.base_storage == BaseStorage::int8 ? w.numel() : (w.numel() + 1) / 2;
      lin += values;
      state += all - values;
    }
  } else {
    lin = linear * (adapters ? storage_element_bytes(peft.base_storage) : cb);
  }
  // The training backend's units hold one float dtype: a layer whose linear weights are stored
  // as its other parameters is one float part; otherwise the linear weights are packed apart.
  if (!peft.quantized() && (!adapters || storage_element_bytes(peft.base_storage) == base_b)) {
    x.frozen_layer.frozen = u.layer;
    x.frozen_layer.frozen_element = base_b;
  } else {
    x.frozen_layer.frozen = other;
    x.frozen_layer.frozen_element = base_b;
    x.frozen_layer.packed = lin;
    x.frozen_layer.quant_state = state;
  }
  if (adapters) {
    x.trained_layer = x.frozen_layer;
    x.trained_layer.trainable = x.lora.params;
  } else {
    x.trained_layer.trainable = u.layer;
  }
  if (u.embeddings > 0) {
    if (peft_embedding_trains(peft)) {
      x.embedding.trainable = u.embedding;
    } else {
      x.embedding.frozen = u.embedding;
      x.embedding.frozen_element = base_b;
    }
  }
  // The head: final norm and (untied, or a tied copy on another stage) the LM head's matrix.
  // LoRA trains neither; full fine-tuning freezes a tied copy with the embedding.
  if (u.heads > 0) {
    const Count norm = m.norm_parameters();
    const Count matrix = u.head - norm;
    if (adapters) {
      x.head.frozen = u.head;
      x.head.frozen_element = base_b;
    } else {
      x.head_matrix_trains = !(m.tied_embeddings && peft.freeze_embeddings);
      x.head.trainable = norm + (x.head_matrix_trains ? matrix : 0);
      x.head.frozen = x.head_matrix_trains ? 0 : matrix;
      x.head.frozen_element = cb;
    }
  }
  return x;
}

void peft_stage_memory(const Scenario& base, const MemoryLayout& l, const StageUnitParams& u,
                       int st, Count vocab, StageMemory& sm) {
  const ModelSpec& m = base.model;
  const TrainingSpec& t = base.training;
  const PeftSpec& peft = t.peft;
  const FrameworkProfile& fw = base.assumptions.framework_profile;
  const Count pp = l.pp, v = l.virtual_stages, tp = l.tp, h = m.hidden_size;
  const Bytes cb = bytes_of(t.precision);
  const Count S = l.shard;
  const bool zero = l.zero_stage > 0;
  const bool sp = l.sequence_parallel;
  const Count act_tokens = l.micro_batch_size * (t.seq_length / l.cp);
  const LayerTable table = planner_layer_table(m, t);
  const bool adapters = peft.adapters();
  const PeftUnits units = peft_units(base, table, tp, l.zero_stage, u);
  const LoraLayer& lora = units.lora;
  const Bytes tw = units.weight, tg = units.gradient, tk = units.optimizer;
  const Count end = u.first_layer + u.layers;
  const bool emb_trains = peft_embedding_trains(peft);
  const bool head_matrix_trains = units.head_matrix_trains;

  sm.stage = st;
  sm.num_layers = u.layers;

  // Model states, unit by unit: the trainable part padded to the shard group under ZeRO.
  struct Held {
    const PeftUnit* unit;
    Count count;
  };
  const Held held[] = {{&units.frozen_layer, units.frozen_layers},
                       {&units.trained_layer, units.trained_layers},
                       {&units.embedding, u.embeddings},
                       {&units.head, u.heads}};
  Count full = 0, sharded = 0, largest_padded = 0;
  Bytes frozen_w = 0;
  for (const Held& x : held) {
    if (x.count == 0) continue;
    const PeftUnit& w = *x.unit;
    const Count shard = ceil_div(w.trainable, S);
    const Count padded = zero ? shard * S : w.trainable;
    full += padded * x.count;
    sharded += shard * x.count;
    largest_padded = std::max(largest_padded, padded);
    frozen_w += w.frozen_held(l.zero_stage, S) * x.count;
  }
  sm.parameters = u.total() + units.trained_layers * (adapters ? lora.params : 0);
  sm.weights_bytes = frozen_w + (l.zero_stage >= 3 ? sharded : full) * tw;
  // bitsandbytes' dynamic code for the double-quantized absmax: one per device.
  if (peft.double_quant && u.layers > 0) frozen_w += kBnbDynamicCodeBytes;
  sm.weights_bytes += peft.double_quant && u.layers > 0 ? kBnbDynamicCodeBytes : 0;
  sm.frozen_weights_bytes = frozen_w;
  sm.gradients_bytes = (l.zero_stage >= 2 ? sharded : full) * tg;
  if (!adapters && fw.keeps_compute_dtype_gradients && bf16_optimizer_layout(t, l))
    sm.gradients_bytes += full * cb;
  sm.optimizer_bytes = (l.zero_stage >= 1 ? sharded : full) * tk;
  if (l.offload_optimizer != Offload::none) {
    sm.optimizer_bytes = 0;
    if (l.zero_stage >= 2) sm.gradients_bytes = 0;
  }
  const OffloadBytes off =
      offload_bytes(l.offload_optimizer, Offload::none, t, base.assumptions, sharded);
  sm.host_bytes = off.host;
  sm.nvme_bytes = off.nvme;
  if (peft.paged_optimizer) {
    // bitsandbytes' paged optimizers keep their states in unified memory, paged out to the host
    // under memory pressure (Dettmers et al. 2023, sec. 3): counted evicted, in host memory.
    sm.host_bytes += sm.optimizer_bytes;
    sm.optimizer_bytes = 0;
  }

  // Activations: each layer by whether it trains and whether the gradient reaches its input.
  TrainingSpec local = t;
  local.seq_length = t.seq_length / l.cp;
  local.micro_batch_size = l.micro_batch_size;
  auto layer_act = [&](Count layer) {
    const bool trains = peft_layer_trains(peft, layer);
    return peft_layer_activation(table, m, local, trains ? lora : LoraLayer{}, trains && !adapters,
                                 peft_grad_reaches(peft, layer), sp, tp, l.recompute);
  };
  Bytes stage_kept = 0, working = 0;
  LayerActivation typical;  // an adapted layer with the gradient at its input
  if (u.layers > 0) {
    const Count above = std::max(peft.frozen_layers + 1, u.first_layer);
    typical = layer_act(std::min(above, m.num_layers - 1));
    if (v == 1) {
      // Layers below frozen_layers, the first trained one, and the rest alike.
      for (Count i = u.first_layer; i < end; ++i) {
        if (i > peft.frozen_layers && i > u.first_layer) {
          stage_kept += (end - i) * typical.kept;
          working = std::max(working, typical.working);
          break;
        }
        const LayerActivation a = layer_act(i);
        stage_kept += a.kept;
        working = std::max(working, a.working);
      }
    } else {
      // Every chunk as the adapted layers (an upper bound by one norm input for the chunk with
      // layer 0, where no gradient arrives from the frozen embedding).
      stage_kept = u.layers * typical.kept;
      working = typical.working;
    }
  }
  const Bytes token_h = act_tokens * h;
  const Bytes local_h = sp ? token_h / tp : token_h;
  sm.embedding_activation_bytes = 0;
  if (holds_embedding(l.schedule, pp, st) && (emb_trains || peft.input_requires_grad)) {
    if (t.dropout > 0) sm.embedding_activation_bytes += local_h;
    if (m.embedding_norm) sm.embedding_activation_bytes += local_h * cb;
  }
  // The final norm keeps its input (the gradient passes through it to the layers); the LM head
  // keeps its input only when its matrix trains.
  sm.head_activation_bytes =
      holds_head(l.schedule, pp, st) ? (head_matrix_trains ? 2 : 1) * local_h * cb : 0;
  sm.activation_bytes_per_microbatch =
      stage_kept + sm.embedding_activation_bytes + sm.head_activation_bytes;
  sm.inflight_chunks =
      inflight_chunks(l.schedule, pp, v, st, l.num_microbatches, l.zb_memory_limit);
  sm.inflight_microbatches = static_cast<double>(sm.inflight_chunks) / static_cast<double>(v);
  sm.activations_bytes = activation_peak_bytes(l.schedule, pp, v, st, l.num_microbatches,
                                               v == 1 ? stage_kept : (u.layers / v) * typical.kept,
                                               sm.embedding_activation_bytes,
                                               sm.head_activation_bytes, l.zb_memory_limit);
  if (fw.pipeline_output_buffers && pp > 1 && v == 1 && st != head_stage(l.schedule, pp)) {
    const Bytes output = token_h * cb / tp;
    sm.activation_bytes_per_microbatch += output;
    sm.activations_bytes += sm.inflight_chunks * output;
  }
  sm.working_bytes = working;
  sm.activations_bytes += sm.working_bytes;

  // Buffers: the logits workspace; ZeRO-2/3's unit gradient and gathered units; a quantized
  // weight dequantized to the compute dtype for its GEMM (bitsandbytes MatMul4Bit: forward, and
  // again for the input gradient; MatMul8bitLt's backward likewise), one tensor at a time.
  const Bytes logits_ws = logits_workspace_bytes(base, l, st, vocab);
  Bytes zero_ws = 0;
  if (S > 1 && l.zero_stage >= 2) {
    zero_ws = largest_padded * tg;
    if (l.zero_stage == 3) {
      // Gathered units: the current one and zero3_prefetch_layers more of one pass, each with
      // its frozen part and its adapters (gathered together); layers as the adapted ones.
      auto gathered = [&](const PeftUnit& w) {
        return w.frozen_gathered(S) + ceil_div(w.trainable, S) * S * tw;
      };
      const Count k = 1 + base.assumptions.zero3_prefetch_layers;
      const Count per_chunk = u.layers / v;
      const bool emb = u.embeddings > 0, hd = u.heads > 0;
      const Bytes e = emb ? gathered(units.embedding) : 0, hb = hd ? gathered(units.head) : 0;
      const Bytes lb =
          gathered(units.trained_layers > 0 ? units.trained_layer : units.frozen_layer);
      zero_ws += v == 1 ? detail::max_window(emb, e, per_chunk, lb, hd, hb, k)
                        : std::max(detail::max_window(emb, e, per_chunk, lb, false, 0, k),
                                   detail::max_window(false, 0, per_chunk, lb, hd, hb, k));
    }
  }
  Bytes dequant = 0;
  if (peft.quantized() && u.layers > 0) {
    for (const WeightTensor& w : layer_weight_tensors(m, peft.naming))
      dequant = std::max(dequant, w.numel() * cb);
  }
  sm.buffers_bytes = std::max(logits_ws, zero_ws + dequant);

  LayerActivation act = typical;
  framework_terms(base, l, u, act, st, vocab, sm);
}

}  // namespace distplan
