// JSON of the MoE and MLA model fields and their Hugging Face mapping (docs/moe.md).
#include "moe_json.h"

#include <algorithm>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "distplan/planner/error.h"
#include "distplan/planner/moe.h"
#include "distplan/planner/pipeline_split.h"

namespace distplan::detail {

using nlohmann::json;

namespace {

constexpr Count kMaxWidth = Count{1} << 22;  // as hidden and ffn sizes
constexpr Count kMaxExperts = Count{1} << 16;
constexpr double kMaxParameters = 1e14;  // validate.cpp's bound

void read_moe(const json& doc, const std::string& path, MoeSpec& e) {
  ObjectReader r(doc, path);
  if (auto v = r.integer("num_experts", 1, kMaxExperts)) e.num_experts = *v;
  if (auto v = r.integer("top_k", 1, kMaxExperts)) e.top_k = *v;
  if (auto v = r.integer("expert_ffn_hidden_size", 1, kMaxWidth)) e.expert_ffn_hidden_size = *v;
  if (auto v = r.integer("num_shared_experts", 0, 1024)) e.num_shared_experts = *v;
  if (auto v = r.integer("shared_expert_ffn_hidden_size", 1, kMaxWidth))
    e.shared_expert_ffn_hidden_size = *v;
  if (auto v = r.boolean("shared_expert_gate")) e.shared_expert_gate = *v;
  if (auto v = r.integer("first_dense_layers", 0, 100000)) e.first_dense_layers = *v;
  if (auto v = r.integer("layer_frequency", 1, 100000)) e.layer_frequency = *v;
  if (const json* l = r.take("layers")) {
    const std::string lp = r.child("layers");
    if (l->is_null()) {
      e.layers.clear();
    } else {
      if (!l->is_array()) throw InputError(lp, "must be an array of layer indices (from 0)");
      if (l->size() > 100000) throw InputError(lp, "lists more than 100000 layers");
      e.layers.clear();
      for (std::size_t i = 0; i < l->size(); ++i) {
        const json& v = (*l)[i];
        if (!v.is_number_integer() || v.get<Count>() < 0 || v.get<Count>() > 100000)
          throw InputError(fmt::format("{}/{}", lp, i), "must be an integer between 0 and 100000");
        if (!e.layers.empty() && v.get<Count>() <= e.layers.back()) {
          throw InputError(fmt::format("{}/{}", lp, i),
                           "layer indices must be listed in increasing order, each once");
        }
        e.layers.push_back(v.get<Count>());
      }
    }
  }
  if (auto i = r.choice("router", {"softmax", "sigmoid"})) e.router = static_cast<Router>(*i);
  if (auto v = r.boolean("router_bias")) e.router_bias = *v;
  if (auto v = r.number("aux_loss_coeff", 0.0, 1000.0, false)) e.aux_loss_coeff = *v;
  if (const json* c = r.take("capacity_factor")) {
    if (c->is_null()) {
      e.capacity_factor.reset();
    } else if (auto v = r.number("capacity_factor", 0.0, 1000.0, true)) {
      e.capacity_factor = *v;
    }
  }
  if (e.num_experts == 0) r.missing("num_experts", "num_experts is required for a MoE model");
  if (e.top_k == 0) r.missing("top_k", "top_k (routed experts per token) is required");
  if (e.expert_ffn_hidden_size == 0)
    r.missing("expert_ffn_hidden_size", "expert_ffn_hidden_size is required");
  r.finish();
}

void read_mla(const json& doc, const std::string& path, MlaSpec& a) {
  ObjectReader r(doc, path);
  if (const json* q = r.take("q_lora_rank")) {
    if (q->is_null()) {
      a.q_lora_rank = 0;
    } else if (auto v = r.integer("q_lora_rank", 1, kMaxWidth)) {
      a.q_lora_rank = *v;
    }
  }
  if (auto v = r.integer("kv_lora_rank", 1, kMaxWidth)) a.kv_lora_rank = *v;
  if (auto v = r.integer("qk_nope_head_dim", 1, 1 << 16)) a.qk_nope_head_dim = *v;
  if (auto v = r.integer("qk_rope_head_dim", 1, 1 << 16)) a.qk_rope_head_dim = *v;
  if (auto v = r.integer("v_head_dim", 1, 1 << 16)) a.v_head_dim = *v;
  for (auto [key, value] : {std::pair{"kv_lora_rank", a.kv_lora_rank},
                            {"qk_nope_head_dim", a.qk_nope_head_dim},
                            {"qk_rope_head_dim", a.qk_rope_head_dim},
                            {"v_head_dim", a.v_head_dim}}) {
    if (value == 0) r.missing(key, fmt::format("{} is required for latent attention", key));
  }
  r.finish();
}

// An upper estimate of the parameters in floating point, before any integer product is formed.
double parameter_bound(const ModelSpec& m) {
  const double h = static_cast<double>(m.hidden_size);
  const double heads = static_cast<double>(m.num_attention_heads);
  double attention = 0;
  if (m.mla.enabled()) {
    const MlaSpec& a = m.mla;
    const double q = static_cast<double>(std::max<Count>(a.q_lora_rank, 1));
    const double qk = static_cast<double>(a.qk_nope_head_dim + a.qk_rope_head_dim);
    const double kv = static_cast<double>(a.kv_lora_rank);
    const double v = static_cast<double>(a.v_head_dim);
    attention =
        h * (q + kv + qk) + q * heads * qk + h * heads * qk + kv * heads * (qk + v) + heads * v * h;
  } else {
    attention = 4.0 * h * static_cast<double>(m.q_hidden() + m.num_kv_heads * m.head_dim());
  }
  const MoeSpec& e = m.moe;
  const double experts =
      static_cast<double>(e.num_experts) * static_cast<double>(e.expert_ffn_hidden_size) +
      static_cast<double>(e.num_shared_experts) *
          static_cast<double>(e.shared_expert_ffn_hidden_size);
  const double ffn = 3.0 * h * std::max(experts, static_cast<double>(m.ffn_hidden_size)) +
                     static_cast<double>(e.num_experts) * h;
  const double layers = static_cast<double>(m.num_layers + m.mtp_layers);
  return layers * (attention + ffn + 4.0 * h) + 2.0 * static_cast<double>(m.vocab_size) * h;
}

[[noreturn]] void fail(const std::string& path, const std::string& msg) {
  throw InputError(path, msg);
}

}  // namespace

void read_moe_mla_fields(ObjectReader& r, ModelSpec& m) {
  if (const json* hd = r.take("head_dim")) {
    if (hd->is_null()) {
      m.explicit_head_dim = 0;
    } else if (auto v = r.integer("head_dim", 1, 1 << 16)) {
      m.explicit_head_dim = *v;
    }
  }
  if (auto v = r.boolean("qk_norm")) m.qk_norm = *v;
  if (auto v = r.integer("mtp_layers", 0, 64)) m.mtp_layers = *v;
  if (const json* moe = r.take("moe")) {
    if (moe->is_null()) {
      m.moe = MoeSpec{};
    } else {
      read_moe(*moe, r.child("moe"), m.moe);
    }
  }
  if (const json* mla = r.take("mla")) {
    if (mla->is_null()) {
      m.mla = MlaSpec{};
    } else {
      read_mla(*mla, r.child("mla"), m.mla);
    }
  }
}

void check_moe_mla_fields(const ModelSpec& m, const std::string& path) {
  const MoeSpec& e = m.moe;
  const std::string moe = path + "/moe";
  if (e.enabled()) {
    if (e.top_k < 1 || e.top_k > e.num_experts) {
      fail(moe + "/top_k",
           fmt::format("top_k={} must be between 1 and num_experts={}", e.top_k, e.num_experts));
    }
    if (e.expert_ffn_hidden_size < 1)
      fail(moe + "/expert_ffn_hidden_size", "expert_ffn_hidden_size must be positive");
    if (e.num_shared_experts > 0 && e.shared_expert_ffn_hidden_size < 1) {
      fail(moe + "/shared_expert_ffn_hidden_size",
           "shared_expert_ffn_hidden_size is required with num_shared_experts > 0");
    }
    if (e.shared_expert_gate && e.num_shared_experts == 0)
      fail(moe + "/shared_expert_gate", "a shared-expert gate needs num_shared_experts > 0");
    if (e.layer_frequency < 1) fail(moe + "/layer_frequency", "layer_frequency must be >= 1");
    if (!e.layers.empty()) {
      if (e.first_dense_layers != 0 || e.layer_frequency != 1) {
        fail(moe + "/layers",
             "an explicit list of MoE layers replaces first_dense_layers and layer_frequency; "
             "give one or the other");
      }
      if (e.layers.back() >= m.num_layers + m.mtp_layers) {
        fail(
            moe + "/layers",
            fmt::format("layer {} is beyond the model's {} layers{}", e.layers.back(), m.num_layers,
                        m.mtp_layers > 0 ? fmt::format(" and {} MTP layers", m.mtp_layers)
                                         : std::string()));
      }
      if (e.layers.front() >= m.num_layers)
        fail(moe + "/layers", "the list places no MoE layer among the main model's layers");
    }
    if (e.first_dense_layers >= m.num_layers) {
      fail(moe + "/first_dense_layers",
           fmt::format("first_dense_layers={} leaves no MoE layer among num_layers={}",
                       e.first_dense_layers, m.num_layers));
    }
  }
  if (m.mla.enabled()) {
    const MlaSpec& a = m.mla;
    if (a.qk_nope_head_dim < 1 || a.qk_rope_head_dim < 1 || a.v_head_dim < 1) {
      fail(path + "/mla", "qk_nope_head_dim, qk_rope_head_dim and v_head_dim must be positive");
    }
  }
  const double bound = parameter_bound(m);
  if (bound > kMaxParameters) {
    fail(e.enabled() ? moe : path,
         fmt::format("the model has about {:.3g} parameters, more than the {:.0e} distplan "
                     "supports",
                     bound, kMaxParameters));
  }
}

void refuse_unplanned_model(const Scenario& s) {
  const ModelSpec& m = s.model;
  if (!m.moe.enabled() && !m.mla.enabled() && m.mtp_layers == 0) return;
  if (m.mtp_layers > 0) {
    // The MTP modules plan with the LM head's chunk (layout.h, layer_kinds; memory_terms.h,
    // mtp_head_parameters). Their projection's and second head's tensor- and context-parallel
    // exchanges are not modelled.
    const char* mtp = "is not modelled with multi-token prediction modules (mtp_layers > 0)";
    if (s.parallel.tp > 1) {
      fail("/parallel/tp",
           fmt::format("tp={} {}: the MTP projection's gather and its head's collectives; use "
                       "tp 1 (DeepSeek-V3's layout) or mtp_layers 0",
                       s.parallel.tp, mtp));
    }
    if (s.parallel.cp > 1) {
      fail("/parallel/cp", fmt::format("cp={} {}: the MTP shift of tokens across context-parallel "
                                       "ranks; use cp 1 or mtp_layers 0",
                                       s.parallel.cp, mtp));
    }
    const PipelineSplit split = pipeline_split(s);
    if (split.mtp_virtual_stage >= 0) {
      const auto vs = static_cast<std::size_t>(split.mtp_virtual_stage);
      if (split.first[vs] + split.layers[vs] != m.num_layers) {
        fail("/parallel/pipeline_split/layout",
             "MTP layers ('m') on a virtual stage other than the one with the last decoder layer "
             "are not modelled; place them after the last 't'");
      }
    }
  }
  if (m.mla.enabled()) {
    // MLA plans (layer_ops.cpp); what its layer does not have a model for is refused here.
    const char* mla = "is not modelled with multi-head latent attention";
    if (m.qk_norm) fail("/model/qk_norm", fmt::format("q/k norms {}", mla));
    if (s.parallel.recompute == Recompute::selective_op) {
      fail("/parallel/recompute",
           fmt::format("selective_op (torchtitan's per-op policy) {}; use none, selective or full",
                       mla));
    }
  }
  const MoeSpec& e = m.moe;
  if (!e.enabled()) return;
  const ParallelSpec& p = s.parallel;
  const char* why = "is not modelled for Mixture-of-Experts models";
  if (p.etp > 1 && m.bias) {
    fail("/parallel/etp",
         fmt::format("etp={} with biased experts is not modelled (the replicated output-projection "
                     "bias of a tensor-parallel expert); use etp 1",
                     p.etp));
  }
  if (p.tp > 1 && !p.sequence_parallel) {
    fail("/parallel/sequence_parallel",
         "a MoE model with tp > 1 needs sequence_parallel: Megatron-LM requires it (arguments.py: "
         "'When using MoE and tensor parallelism, sequence parallelism must be used') and the "
         "planner routes each TP rank's sequence shard");
  }
  if (p.zero_stage > 0 && p.fsdp_shard_size > 0 && p.fsdp_shard_size != p.dp) {
    fail("/parallel/fsdp_shard_size", fmt::format("hybrid sharding {}", why));
  }
  if (p.recompute == Recompute::selective_op) {
    fail("/parallel/recompute",
         fmt::format("selective_op (torchtitan's per-op policy) {}; use none, selective or full",
                     why));
  }
  if (p.offload_optimizer != Offload::none)
    fail("/parallel/offload_optimizer", fmt::format("optimizer offload {}", why));
  if (p.offload_params != Offload::none)
    fail("/parallel/offload_params", fmt::format("parameter offload {}", why));
}

void put_moe_mla_fields(const ModelSpec& m, json& j) {
  if (m.explicit_head_dim > 0) j["head_dim"] = m.explicit_head_dim;
  if (m.qk_norm) j["qk_norm"] = true;
  if (m.moe.enabled()) {
    const MoeSpec& e = m.moe;
    j["moe"] = {{"num_experts", e.num_experts},
                {"top_k", e.top_k},
                {"expert_ffn_hidden_size", e.expert_ffn_hidden_size},
                {"num_shared_experts", e.num_shared_experts},
                {"shared_expert_gate", e.shared_expert_gate},
                {"first_dense_layers", e.first_dense_layers},
                {"layer_frequency", e.layer_frequency},
                {"router", to_string(e.router)},
                {"router_bias", e.router_bias},
                {"aux_loss_coeff", e.aux_loss_coeff},
                {"capacity_factor", e.capacity_factor ? json(*e.capacity_factor) : json()}};
    if (e.shared_expert_ffn_hidden_size > 0)
      j["moe"]["shared_expert_ffn_hidden_size"] = e.shared_expert_ffn_hidden_size;
    if (!e.layers.empty()) j["moe"]["layers"] = e.layers;
  }
  if (m.mla.enabled()) {
    const MlaSpec& a = m.mla;
    j["mla"] = {{"q_lora_rank", a.q_lora_rank > 0 ? json(a.q_lora_rank) : json()},
                {"kv_lora_rank", a.kv_lora_rank},
                {"qk_nope_head_dim", a.qk_nope_head_dim},
                {"qk_rope_head_dim", a.qk_rope_head_dim},
                {"v_head_dim", a.v_head_dim}};
  }
  if (m.mtp_layers > 0) j["mtp_layers"] = m.mtp_layers;
}

// --- Hugging Face config.json ---------------------------------------------------------------

namespace {

bool is_deepseek(std::string_view t) {
  return t == "deepseek_v2" || t == "deepseek_v3" || t == "kimi_k2";
}

}  // namespace

bool hf_family_maps(std::string_view t, std::string_view key) noexcept {
  if (t == "mixtral" || t == "gpt_oss" || t == "llama4_text")
    return key == "num_local_experts" || key == "num_experts_per_tok";
  if (t == "qwen2_moe" || t == "qwen3_moe") {
    return key == "num_experts" || key == "num_experts_per_tok" || key == "moe_intermediate_size" ||
           key == "decoder_sparse_step" || key == "mlp_only_layers" ||
           (t == "qwen2_moe" && key == "shared_expert_intermediate_size");
  }
  if (is_deepseek(t)) {
    for (std::string_view k :
         {"n_routed_experts", "n_shared_experts", "moe_intermediate_size", "num_experts_per_tok",
          "first_k_dense_replace", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
          "qk_nope_head_dim", "v_head_dim", "num_nextn_predict_layers", "moe_layer_freq"}) {
      if (key == k) return true;
    }
  }
  return false;
}

bool hf_family_accepts_yarn(std::string_view t) noexcept {
  return is_deepseek(t) || t == "gpt_oss";
}

void map_hf_moe_mla(const json& cfg, const std::string& path, std::string_view t, ModelSpec& m) {
  auto field = [&](const char* key, Count min, std::optional<Count> fallback) -> Count {
    auto it = cfg.find(key);
    if (it == cfg.end() || it->is_null()) {
      if (fallback) return *fallback;
      fail(path, fmt::format("config.json lacks {}", key));
    }
    if (!it->is_number_integer() || it->get<Count>() < min || it->get<Count>() > (Count{1} << 26))
      fail(path + "/" + key, fmt::format("{} must be an integer of at least {}", key, min));
    return it->get<Count>();
  };
  auto text = [&](const char* key, const char* fallback) -> std::string {
    auto it = cfg.find(key);
    if (it == cfg.end() || it->is_null()) return fallback;
    if (!it->is_string()) fail(path + "/" + key, fmt::format("{} must be a string", key));
    return it->get<std::string>().substr(0, 64);
  };
  // Qwen3 normalises each query and key head (HF Qwen3Attention q_norm, k_norm).
  if (t == "qwen3" || t == "qwen3_moe") m.qk_norm = true;
  // The load-balancing loss's coefficient: router_aux_loss_coef (transformers MixtralConfig,
  // Qwen2MoeConfig, Qwen3MoeConfig; their default 0.001), DeepSeek's aux_loss_alpha (the
  // released configuration_deepseek.py, default 0.001).
  auto coefficient = [&](const char* key) {
    auto it = cfg.find(key);
    if (it == cfg.end() || it->is_null()) return 0.001;
    if (!it->is_number() || it->get<double>() < 0 || it->get<double>() > 1000)
      fail(path + "/" + key, fmt::format("{} must be a number between 0 and 1000", key));
    return it->get<double>();
  };

  if (t == "mixtral") {
    // MixtralSparseMoeBlock: every layer; experts of intermediate_size; softmax router, dropless.
    m.moe.num_experts = field("num_local_experts", 1, std::nullopt);
    m.moe.top_k = field("num_experts_per_tok", 1, std::nullopt);
    m.moe.expert_ffn_hidden_size = m.ffn_hidden_size;
    m.moe.aux_loss_coeff = coefficient("router_aux_loss_coef");
  } else if (t == "gpt_oss") {
    // GptOssMLP (transformers modeling_gpt_oss.py): every layer a MoE layer; GptOssTopKRouter
    // (E x h weight and an E bias, top-k then softmax), GptOssExperts with biased gate_up
    // (h -> 2f) and down (f -> h) projections of intermediate_size; the model's linears all have
    // biases (attention_bias), so `bias` covers the experts'.
    m.moe.num_experts = field("num_local_experts", 1, std::nullopt);
    m.moe.top_k = field("num_experts_per_tok", 1, std::nullopt);
    m.moe.expert_ffn_hidden_size = m.ffn_hidden_size;
    m.moe.router_bias = true;
    m.moe.aux_loss_coeff = coefficient("router_aux_loss_coef");
  } else if (t == "llama4_text") {
    // Llama4TextMoe (transformers modeling_llama4.py): num_local_experts experts and one shared
    // expert of intermediate_size, a router without bias; the MoE layers are moe_layers, or
    // every interleave_moe_layer_step-th from interleave_moe_layer_step - 1
    // (configuration_llama4.py); the other layers' Llama4TextMLP is intermediate_size_mlp wide.
    m.moe.num_experts = field("num_local_experts", 1, 16);
    m.moe.top_k = field("num_experts_per_tok", 1, 1);
    m.moe.expert_ffn_hidden_size = field("intermediate_size", 1, 8192);
    m.moe.num_shared_experts = 1;
    m.moe.shared_expert_ffn_hidden_size = m.moe.expert_ffn_hidden_size;
    m.moe.router = Router::sigmoid;
    m.moe.aux_loss_coeff = coefficient("router_aux_loss_coef");
    m.ffn_hidden_size = field("intermediate_size_mlp", 1, 16384);
    if (auto it = cfg.find("moe_layers"); it != cfg.end() && !it->is_null()) {
      if (!it->is_array()) fail(path + "/moe_layers", "moe_layers must be a list");
      for (std::size_t i = 0; i < it->size(); ++i) {
        const json& v = (*it)[i];
        if (!v.is_number_integer() || v.get<Count>() < 0 || v.get<Count>() >= m.num_layers ||
            (!m.moe.layers.empty() && v.get<Count>() <= m.moe.layers.back())) {
          fail(fmt::format("{}/moe_layers/{}", path, i),
               "increasing layer indices below num_hidden_layers");
        }
        m.moe.layers.push_back(v.get<Count>());
      }
      if (m.moe.layers.empty()) m.moe = MoeSpec{};  // no MoE layer: a dense model
    } else {
      const Count step = field("interleave_moe_layer_step", 1, 1);
      m.moe.first_dense_layers = step - 1;
      m.moe.layer_frequency = step;
    }
  } else if (t == "qwen2_moe" || t == "qwen3_moe") {
    // Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer: layer i is sparse when it is not in
    // mlp_only_layers and (i + 1) % decoder_sparse_step == 0, else a dense MLP of
    // intermediate_size. Missing fields take the config classes' defaults (transformers
    // configuration_qwen2_moe.py: 60 experts, top-4, 1408, a shared expert of 5632;
    // configuration_qwen3_moe.py: 128 experts, top-8, 768), as transformers builds the model.
    const bool q2 = t == "qwen2_moe";
    m.moe.num_experts = field("num_experts", 1, q2 ? 60 : 128);
    m.moe.top_k = field("num_experts_per_tok", 1, q2 ? 4 : 8);
    m.moe.expert_ffn_hidden_size = field("moe_intermediate_size", 1, q2 ? 1408 : 768);
    const Count step = field("decoder_sparse_step", 1, 1);
    std::vector<Count> dense_only;
    if (auto it = cfg.find("mlp_only_layers"); it != cfg.end() && !it->is_null()) {
      if (!it->is_array()) fail(path + "/mlp_only_layers", "mlp_only_layers must be a list");
      for (std::size_t i = 0; i < it->size(); ++i) {
        const json& v = (*it)[i];
        if (!v.is_number_integer() || v.get<Count>() < 0 || v.get<Count>() > 100000) {
          fail(fmt::format("{}/mlp_only_layers/{}", path, i), "a layer index between 0 and 100000");
        }
        dense_only.push_back(v.get<Count>());
      }
    }
    if (dense_only.empty()) {
      // (i + 1) % step == 0: every step-th layer from layer step - 1.
      m.moe.first_dense_layers = step - 1;
      m.moe.layer_frequency = step;
    } else {
      for (Count i = 0; i < m.num_layers; ++i) {
        if ((i + 1) % step == 0 &&
            std::find(dense_only.begin(), dense_only.end(), i) == dense_only.end())
          m.moe.layers.push_back(i);
      }
      if (m.moe.layers.empty()) fail(path + "/mlp_only_layers", "leaves no MoE layer");
    }
    m.moe.aux_loss_coeff = coefficient("router_aux_loss_coef");
    if (q2) {
      // Qwen2MoeSparseMoeBlock always builds one shared expert of
      // shared_expert_intermediate_size (default 5632) behind a sigmoid gate (h -> 1).
      const Count shared = field("shared_expert_intermediate_size", 0, 5632);
      if (shared > 0) {
        m.moe.num_shared_experts = 1;
        m.moe.shared_expert_ffn_hidden_size = shared;
        m.moe.shared_expert_gate = true;
      }
    }
  } else if (is_deepseek(t)) {
    // DeepseekV2/V3 MoE (HF modeling_deepseek_v3.py and the released modeling_deepseek.py):
    // layer i is a MoE layer when i >= first_k_dense_replace and i % moe_layer_freq == 0;
    // n_shared_experts shared experts of moe_intermediate_size each. Kimi K2 (model_type
    // kimi_k2) is DeepSeek-V3's architecture (its config.json names DeepseekV3ForCausalLM).
    const Count freq = field("moe_layer_freq", 1, 1);
    m.moe.num_experts = field("n_routed_experts", 1, std::nullopt);
    m.moe.top_k = field("num_experts_per_tok", 1, std::nullopt);
    m.moe.expert_ffn_hidden_size = field("moe_intermediate_size", 1, std::nullopt);
    m.moe.num_shared_experts = field("n_shared_experts", 0, 0);
    m.moe.aux_loss_coeff = coefficient("aux_loss_alpha");
    if (m.moe.num_shared_experts > 0)
      m.moe.shared_expert_ffn_hidden_size = m.moe.expert_ffn_hidden_size;
    const Count first = field("first_k_dense_replace", 0, 0);
    if (freq == 1 || first % freq == 0) {
      m.moe.first_dense_layers = first;
      m.moe.layer_frequency = freq;
    } else {
      // i >= first and i % freq == 0 is not of the form first + k·freq: list the layers.
      for (Count i = first; i < m.num_layers + field("num_nextn_predict_layers", 0, 0); ++i) {
        if (i % freq == 0) m.moe.layers.push_back(i);
      }
      if (m.moe.layers.empty() || m.moe.layers.front() >= m.num_layers)
        fail(path + "/first_k_dense_replace", "first_k_dense_replace leaves no MoE layer");
    }
    const std::string scoring = text("scoring_func", "softmax");
    if (scoring != "softmax" && scoring != "sigmoid")
      fail(path + "/scoring_func", fmt::format("scoring_func '{}' is not modelled", scoring));
    m.moe.router = scoring == "sigmoid" ? Router::sigmoid : Router::softmax;
    // The auxiliary-loss-free balancing of DeepSeek-V3 (report, sec. 2.1.2) adds a per-expert
    // bias, e_score_correction_bias, with topk_method "noaux_tc".
    const std::string method = text("topk_method", "greedy");
    if (method != "greedy" && method != "group_limited_greedy" && method != "noaux_tc")
      fail(path + "/topk_method", fmt::format("topk_method '{}' is not modelled", method));
    m.moe.router_bias = method == "noaux_tc";
    // MLA: keys and values come from the latent; num_key_value_heads plays no part.
    m.mla.q_lora_rank = field("q_lora_rank", 1, 0);
    m.mla.kv_lora_rank = field("kv_lora_rank", 1, std::nullopt);
    m.mla.qk_nope_head_dim = field("qk_nope_head_dim", 1, std::nullopt);
    m.mla.qk_rope_head_dim = field("qk_rope_head_dim", 1, std::nullopt);
    m.mla.v_head_dim = field("v_head_dim", 1, std::nullopt);
    m.num_kv_heads = m.num_attention_heads;
    m.mtp_layers = field("num_nextn_predict_layers", 0, 0);
  }
  if (m.moe.enabled() && m.moe.first_dense_layers >= m.num_layers) {
    const char* key = is_deepseek(t) ? "first_k_dense_replace" : "decoder_sparse_step";
    fail(path + "/" + key, fmt::format("{} leaves no MoE layer", key));
  }
}

}  // namespace distplan::detail
