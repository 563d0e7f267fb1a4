// Strict scenario parsing, defaults, and the plan/v1 document (shared API.md).
#include "distplan/planner/scenario_json.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "attention_json.h"
#include "distplan/planner/error.h"
#include "distplan/planner/interval.h"
#include "distplan/planner/layout.h"
#include "distplan/planner/moe.h"
#include "distplan/planner/moe_layer.h"
#include "distplan/planner/peft.h"
#include "distplan/planner/presets.h"
#include "distplan/planner/suggest.h"
#include "distplan/planner/validate.h"
#include "json_reader.h"
#include "moe_json.h"
#include "peft_json.h"

namespace distplan {

using detail::ObjectReader;
using nlohmann::json;

namespace {

constexpr Count kMaxDim = Count{1} << 22;  // hidden / ffn size limit (4M)
// Lower bounds that keep every time finite (docs/limits.md): with at most ~1e30 FLOPs and 1e18
// bytes per step, a step at these rates is at most ~1e27 s, far from overflow; below them
// (1e-300 was accepted) the step came out infinite.
constexpr double kMinPeakFlops = 1e6;  // FLOP/s
constexpr double kMinBandwidth = 1e3;  // bytes/s

// A figure where 0 means "none" (no FP8 tensor cores, no host link, no NVMe) and anything else
// must reach `min`: a 1e-300 rate gave an infinite time, null in JSON (issue 29, item 15).
std::optional<double> zero_or_at_least(ObjectReader& r, std::string_view key, double min,
                                       double max, const char* none) {
  const std::optional<double> v = r.number(key, 0, max, false);
  if (v && *v > 0 && *v < min)
    throw InputError(r.child(key),
                     fmt::format("{}={:g} must be 0 ({}) or at least {:g}", key, *v, none, min));
  return v;
}
constexpr double kMinEfficiency = 1e-3;

template <typename E>
void read_enum(ObjectReader& r, std::string_view key, E& out,
               std::initializer_list<std::string_view> names) {
  if (auto i = r.choice(key, names)) out = static_cast<E>(*i);
}

DType read_dtype(ObjectReader& r, std::string_view key, DType fallback) {
  DType d = fallback;
  read_enum(r, key, d, {"fp32", "fp16", "bf16"});
  return d;
}

std::string unknown_preset_message(std::string_view kind, const std::string& name) {
  std::vector<std::string> names;
  for (const PresetInfo& p : kind == "GPU" ? gpu_presets() : model_presets())
    names.push_back(p.name);
  std::string printable;
  for (char c : name.substr(0, 64)) printable += (c >= 0x20 && c < 0x7f) ? c : '?';
  return fmt::format("unknown {} preset '{}'{} (run `distplan presets`)", kind, printable,
                     did_you_mean(name, names));
}

// Model fields present in `r` override `m`.
void read_model_fields(ObjectReader& r, ModelSpec& m) {
  if (auto v = r.integer("num_layers", 1, 100000)) m.num_layers = *v;
  if (auto v = r.integer("hidden_size", 1, kMaxDim)) m.hidden_size = *v;
  if (auto v = r.integer("num_attention_heads", 1, 1 << 16)) m.num_attention_heads = *v;
  if (auto v = r.integer("num_kv_heads", 1, 1 << 16)) m.num_kv_heads = *v;
  if (auto v = r.integer("ffn_hidden_size", 1, kMaxDim)) m.ffn_hidden_size = *v;
  if (auto v = r.integer("vocab_size", 1, Count{1} << 26)) m.vocab_size = *v;
  read_enum(r, "mlp", m.mlp, {"gelu", "swiglu", "geglu"});
  read_enum(r, "norm", m.norm, {"layernorm", "rmsnorm"});
  read_enum(r, "position_embedding", m.position_embedding, {"learned", "rotary", "alibi"});
  if (auto v = r.integer("max_position_embeddings", 1, Count{1} << 24))
    m.max_position_embeddings = *v;
  if (auto v = r.number("rope_theta", 1.0, 1e12, false)) m.rope_theta = *v;
  if (auto v = r.number("rope_scaling_factor", 0.0, 1024.0, false)) m.rope_scaling_factor = *v;
  if (auto v = r.boolean("tied_embeddings")) m.tied_embeddings = *v;
  if (auto v = r.boolean("bias")) m.bias = *v;
  if (auto v = r.boolean("qkv_bias")) m.qkv_bias = *v;
  if (auto v = r.boolean("embedding_norm")) m.embedding_norm = *v;
  detail::read_moe_mla_fields(r, m);
  detail::read_attention_fields(r, m);
}

}  // namespace

ModelSpec detail::read_model(const json& doc, const std::string& path) {
  if (doc.is_string()) {
    const auto name = doc.get<std::string>();
    if (auto m = find_model_preset(name)) return *m;
    throw InputError(path, unknown_preset_message("model", name));
  }
  ObjectReader r(doc, path);
  ModelSpec m;
  m.name = "custom";
  if (const json* hf = r.take("hf_config")) {
    m = model_from_hf_config(*hf, r.child("hf_config"));
  }
  if (const auto preset = r.string("preset")) {
    if (r.has("hf_config"))
      throw InputError(r.child("preset"), "give either preset or hf_config, not both");
    auto p = find_model_preset(*preset);
    if (!p) throw InputError(r.child("preset"), unknown_preset_message("model", *preset));
    m = *p;
  }
  const ModelSpec before = m;
  read_model_fields(r, m);
  if (r.has("preset") && !(m == before)) m.name += " (modified)";
  if (auto n = r.string("name"); n && !r.has("preset")) m.name = n->substr(0, 128);
  r.finish();
  for (std::string_view key :
       {"num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size"}) {
    const Count v = key == "num_layers"            ? m.num_layers
                    : key == "hidden_size"         ? m.hidden_size
                    : key == "num_attention_heads" ? m.num_attention_heads
                    : key == "ffn_hidden_size"     ? m.ffn_hidden_size
                                                   : m.vocab_size;
    if (v == 0)
      throw InputError(r.child(key), fmt::format("{} is required for a custom model", key));
  }
  if (m.num_kv_heads == 0) m.num_kv_heads = m.num_attention_heads;
  detail::check_moe_mla_fields(m, path);
  detail::check_attention_fields(m, path);
  return m;
}

namespace {

void read_peak_flops(const json& doc, const std::string& path, PeakFlops& f) {
  ObjectReader r(doc, path);
  // Lower bound 1 MFLOP/s: below it a step's time is not computable (a 1e-300 rate gives an
  // infinite step); tf32 = 0 means the GPU has no TF32 path (docs/limits.md).
  constexpr double kMax = 1e18, kMin = kMinPeakFlops;
  if (auto v = r.number("fp32", kMin, kMax, false)) f.fp32 = *v;
  if (auto v = r.number("tf32", 0, kMax, false)) {
    if (*v > 0 && *v < kMin)
      throw InputError(r.child("tf32"), fmt::format("must be 0 (no TF32) or at least {:g}", kMin));
    f.tf32 = *v;
  }
  if (auto v = r.number("fp16", kMin, kMax, false)) f.fp16 = *v;
  if (auto v = r.number("bf16", kMin, kMax, false)) f.bf16 = *v;
  // 0 means no FP8 (MXFP8) tensor cores: fp8 training is then refused.
  if (auto v = zero_or_at_least(r, "fp8", kMin, kMax, "no FP8 tensor cores")) f.fp8 = *v;
  if (auto v = zero_or_at_least(r, "mxfp8", kMin, kMax, "no MXFP8 tensor cores")) f.mxfp8 = *v;
  r.finish();
}

}  // namespace

GpuSpec detail::read_gpu(const json& doc, const std::string& path) {
  if (doc.is_string()) {
    const auto name = doc.get<std::string>();
    if (auto g = find_gpu_preset(name)) return *g;
    throw InputError(path, unknown_preset_message("GPU", name));
  }
  ObjectReader r(doc, path);
  GpuSpec g;
  g.name = "custom";
  if (const auto preset = r.string("preset")) {
    auto p = find_gpu_preset(*preset);
    if (!p) throw InputError(r.child("preset"), unknown_preset_message("GPU", *preset));
    g = *p;
  }
  const GpuSpec before = g;
  if (auto v = r.integer("memory_bytes", 1, Count{1} << 50)) g.memory_bytes = *v;
  if (const json* pf = r.take("peak_flops"))
    read_peak_flops(*pf, r.child("peak_flops"), g.peak_flops);
  constexpr double kMaxBw = 1e15;
  if (auto v = r.number("memory_bandwidth", kMinBandwidth, kMaxBw, false)) g.memory_bandwidth = *v;
  if (auto v = r.number("intra_node_bandwidth", kMinBandwidth, kMaxBw, false))
    g.intra_node_bandwidth = *v;
  if (auto v = r.number("inter_node_bandwidth", kMinBandwidth, kMaxBw, false))
    g.inter_node_bandwidth = *v;
  if (auto v = r.integer("gpus_per_node", 1, 1024)) g.gpus_per_node = *v;
  if (auto v = r.integer("sm_count", 0, 4096)) g.sm_count = *v;
  if (auto v = r.number("gemm_efficiency", kMinEfficiency, 1, false)) g.gemm_efficiency = *v;
  if (auto v = r.number("gemm_k_overhead", 0, 4096, false)) g.gemm_k_overhead = *v;
  if (auto v = r.number("memory_efficiency", kMinEfficiency, 1, false)) g.memory_efficiency = *v;
  if (auto v = r.number("flash_forward_efficiency", kMinEfficiency, 1, false))
    g.flash_forward_efficiency = *v;
  if (auto v = r.number("flash_backward_efficiency", kMinEfficiency, 1, false))
    g.flash_backward_efficiency = *v;
  if (auto v = zero_or_at_least(r, "pcie_bandwidth", kMinBandwidth, kMaxBw, "no offload"))
    g.pcie_bandwidth = *v;
  // Time-model figures beyond the roofline (docs/time.md): FP8 GEMM ceilings, PyTorch SDPA's
  // flash kernel, the power the efficiencies hold at and the limit the GPU runs under, the
  // NVLink fabric's size. 0 keeps each one's fallback.
  if (auto v = r.number("fp8_gemm_efficiency", 0, 1, false)) g.fp8_gemm_efficiency = *v;
  if (auto v = r.number("mxfp8_gemm_efficiency", 0, 1, false)) g.mxfp8_gemm_efficiency = *v;
  if (auto v = r.number("sdpa_forward_efficiency", 0, 1, false)) g.sdpa_forward_efficiency = *v;
  if (auto v = r.number("sdpa_backward_efficiency", 0, 1, false)) g.sdpa_backward_efficiency = *v;
  if (auto v = r.number("tdp_watts", 0, 1e5, false)) g.tdp_watts = *v;
  if (auto v = r.number("power_limit_watts", 0, 1e5, false)) g.power_limit_watts = *v;
  if (auto v = r.integer("nvlink_domain_gpus", 0, Count{1} << 20)) g.nvlink_domain_gpus = *v;
  if (auto n = r.string("name"); n && !r.has("preset")) g.name = n->substr(0, 128);
  r.finish();
  if (r.has("preset") && !(g == before)) g.name += " (modified)";
  if (g.memory_bytes == 0)
    throw InputError(r.child("memory_bytes"), "memory_bytes is required for a custom GPU");
  if (g.memory_bandwidth == 0)
    throw InputError(r.child("memory_bandwidth"), "memory_bandwidth is required for a custom GPU");
  if (g.intra_node_bandwidth == 0)
    throw InputError(r.child("intra_node_bandwidth"),
                     "intra_node_bandwidth is required for a custom GPU");
  if (g.inter_node_bandwidth == 0)
    throw InputError(r.child("inter_node_bandwidth"),
                     "inter_node_bandwidth is required for a custom GPU");
  return g;
}

namespace {

std::vector<Count> read_count_list(const json& doc, const std::string& path) {
  if (!doc.is_array()) throw InputError(path, "must be an array of integers");
  std::vector<Count> out;
  for (std::size_t i = 0; i < doc.size(); ++i) {
    const json& v = doc[i];
    const std::string p = fmt::format("{}/{}", path, i);
    if (!v.is_number_integer() || v.get<Count>() < 0 || v.get<Count>() > 100000) {
      throw InputError(p, "must be an integer between 0 and 100000");
    }
    out.push_back(v.get<Count>());
  }
  return out;
}

// parallel.pipeline_split: a framework's split rule and its own flags (pipeline_split.h).
void read_pipeline_split(const json& doc, PipelineSplitSpec& x) {
  const std::string at = "/parallel/pipeline_split";
  if (!doc.is_object()) throw InputError(at, "must be an object with a \"rule\"");
  ObjectReader r(doc, at);
  const auto rule = r.choice("rule", {"even", "megatron", "megatron_layout", "torchtitan"});
  if (!rule) r.missing("rule", "rule is required: even, megatron, megatron_layout or torchtitan");
  static constexpr SplitRule kRules[] = {SplitRule::even, SplitRule::megatron,
                                         SplitRule::megatron_layout, SplitRule::torchtitan};
  x.rule = kRules[*rule];
  // Each rule takes its framework's flags only.
  auto only = [&](std::string_view key, SplitRule owner) {
    if (r.has(key) && x.rule != owner) {
      throw InputError(r.child(key), fmt::format("belongs to rule {}, not {}", to_string(owner),
                                                 to_string(x.rule)));
    }
  };
  for (std::string_view k :
       {"first_stage_layers", "last_stage_layers", "account_for_embedding", "account_for_loss"})
    only(k, SplitRule::megatron);
  only("layout", SplitRule::megatron_layout);
  only("first_stage_less_layers", SplitRule::torchtitan);
  only("last_stage_less_layers", SplitRule::torchtitan);
  if (auto v = r.integer("first_stage_layers", 0, 100000)) x.first_stage_layers = *v;
  if (auto v = r.integer("last_stage_layers", 0, 100000)) x.last_stage_layers = *v;
  if (auto v = r.boolean("account_for_embedding")) x.account_for_embedding = *v;
  if (auto v = r.boolean("account_for_loss")) x.account_for_loss = *v;
  if (auto v = r.string("layout")) {
    if (v->size() > 100000) throw InputError(r.child("layout"), "is longer than 100000 characters");
    x.layout = *v;
  } else if (x.rule == SplitRule::megatron_layout) {
    r.missing("layout",
              "rule megatron_layout needs the layout string (Megatron-LM "
              "--pipeline-model-parallel-layout, e.g. \"Et*3|(tt|)*29,m|L\")");
  }
  if (auto v = r.integer("first_stage_less_layers", 0, 100000)) x.first_stage_less_layers = *v;
  if (auto v = r.integer("last_stage_less_layers", 0, 100000)) x.last_stage_less_layers = *v;
  r.finish();
}

json to_json(const PipelineSplitSpec& x) {
  json j = {{"rule", to_string(x.rule)}};
  switch (x.rule) {
    case SplitRule::megatron:
      if (x.first_stage_layers) j["first_stage_layers"] = *x.first_stage_layers;
      if (x.last_stage_layers) j["last_stage_layers"] = *x.last_stage_layers;
      j["account_for_embedding"] = x.account_for_embedding;
      j["account_for_loss"] = x.account_for_loss;
      break;
    case SplitRule::megatron_layout:
      j["layout"] = x.layout;
      break;
    case SplitRule::torchtitan:
      j["first_stage_less_layers"] = x.first_stage_less_layers;
      j["last_stage_less_layers"] = x.last_stage_less_layers;
      break;
    case SplitRule::even:
    case SplitRule::explicit_layers:
      break;
  }
  return j;
}

}  // namespace

namespace {

// SAX handler that builds nothing and tracks the JSON pointer of the value being read, so a
// document that fails to parse is reported at the field where it fails (e.g. 1e999 under
// /training/dropout), not only at a byte offset.
class PointerTracker {
 public:
  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(json::number_integer_t) { return value(); }
  bool number_unsigned(json::number_unsigned_t) { return value(); }
  bool number_float(json::number_float_t, const json::string_t&) { return value(); }
  bool string(json::string_t&) { return value(); }
  bool binary(json::binary_t&) { return value(); }
  bool start_object(std::size_t) { return push(false); }
  bool start_array(std::size_t) { return push(true); }
  bool key(json::string_t& k) {
    frames_.back().key = k;
    if (!frames_.back().keys.insert(k).second) {
      duplicate_ = k;
      return false;  // stop: pointer() names the repeated key
    }
    return true;
  }
  /// The first key an object repeats, if the parse stopped at one.
  [[nodiscard]] const std::optional<std::string>& duplicate() const { return duplicate_; }
  /// Whether the parse stopped at an array or object nested deeper than kMaxJsonDepth.
  [[nodiscard]] bool too_deep() const { return too_deep_; }
  bool end_object() { return pop(); }
  bool end_array() { return pop(); }
  bool parse_error(std::size_t, const std::string&, const json::exception&) { return false; }

  /// JSON pointer of the value the parser was reading when it stopped.
  [[nodiscard]] std::string pointer() const {
    std::string p;
    for (const Frame& f : frames_) {
      if (f.array) {
        p += "/" + std::to_string(f.index);
      } else if (f.key) {
        p += "/" + detail::pointer_escape(*f.key);
      }
    }
    return p;
  }

 private:
  struct Frame {
    bool array = false;
    std::size_t index = 0;
    std::optional<std::string> key;
    std::set<std::string> keys;  // an object's keys so far
  };
  bool value() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
    return true;
  }
  bool push(bool array) {
    if (frames_.size() >= static_cast<std::size_t>(kMaxJsonDepth)) {
      too_deep_ = true;
      return false;  // stop: pointer() names the container that holds the deepest one
    }
    frames_.push_back({array, 0, std::nullopt, {}});
    return true;
  }
  bool pop() {
    frames_.pop_back();
    return value();
  }
  std::vector<Frame> frames_;
  std::optional<std::string> duplicate_;
  bool too_deep_ = false;
};

// nlohmann's message without its "[json.exception.<kind>.<id>] " prefix.
std::string strip_exception_prefix(std::string what) {
  if (what.rfind("[json.exception.", 0) == 0) {
    if (const auto pos = what.find("] "); pos != std::string::npos) what = what.substr(pos + 2);
  }
  return what;
}

}  // namespace

json parse_json_text(std::string_view text) {
  // JSON text never holds a raw NUL (RFC 8259 sec. 7: control characters are escaped in strings);
  // one is refused rather than read as the end of the document.
  if (const auto nul = text.find('\0'); nul != std::string_view::npos) {
    throw InputError(
        "", fmt::format("malformed JSON: a NUL byte at offset {} (JSON text has none)", nul));
  }
  try {
    // First a pass that builds nothing (RFC 8259 sec. 9 lets a parser limit nesting): a document
    // nested deeper than any distplan reads is refused before a tree is built (300,000 nested
    // arrays crashed the search's recursive copies; a 16 MiB one took 1.6 GB to refuse; issue
    // 29, items 11 and 12). RFC 8259 sec. 4: names within an object SHOULD be unique; a
    // repeated one would silently override the first (nlohmann keeps the last), so it is
    // refused at its pointer.
    PointerTracker tracker;
    if (!json::sax_parse(text.begin(), text.end(), &tracker)) {
      if (tracker.too_deep()) {
        throw InputError(tracker.pointer(),
                         fmt::format("JSON nested deeper than {} levels here (a scenario has "
                                     "about 5); distplan reads no such document",
                                     kMaxJsonDepth));
      }
      if (tracker.duplicate()) {
        throw InputError(tracker.pointer(),
                         fmt::format("duplicate key '{}': each key may appear once per object",
                                     *tracker.duplicate()));
      }
    }
    json doc = json::parse(text.begin(), text.end());
    return doc;
  } catch (const json::parse_error& e) {
    // A syntax error or ill-formed UTF-8: the document itself is malformed; nlohmann's message
    // gives the line and column.
    throw InputError("", "malformed JSON: " + strip_exception_prefix(e.what()));
  } catch (const json::exception& e) {
    // out_of_range 406: a number such as 1e999 that overflows a double (JSON has no infinity).
    // Parse again, building nothing, to name the field that holds it.
    PointerTracker tracker;
    (void)json::sax_parse(text.begin(), text.end(), &tracker);
    throw InputError(tracker.pointer(), "malformed JSON: " + strip_exception_prefix(e.what()) +
                                            " (numbers must be finite)");
  }
}

namespace {

// config.json fields that add structure distplan does not model (Hugging Face transformers
// configuration_mixtral.py, configuration_deepseek_v3.py, configuration_qwen2_moe.py,
// configuration_qwen3_moe.py): refused, never planned as a dense model.
struct UnsupportedField {
  const char* key;
  const char* what;
};
constexpr UnsupportedField kUnsupportedFields[] = {
    {"num_local_experts", "Mixture-of-Experts layers (Mixtral's experts per layer)"},
    {"n_routed_experts", "Mixture-of-Experts layers (DeepSeek's routed experts)"},
    {"num_experts", "Mixture-of-Experts layers (Qwen-MoE's experts per layer)"},
    {"n_shared_experts", "Mixture-of-Experts shared experts"},
    {"shared_expert_intermediate_size", "Mixture-of-Experts shared experts"},
    {"moe_intermediate_size", "Mixture-of-Experts expert FFN size"},
    {"num_experts_per_tok", "Mixture-of-Experts routing (experts per token)"},
    {"first_k_dense_replace", "Mixture-of-Experts layer placement"},
    {"q_lora_rank", "multi-head latent attention (DeepSeek MLA)"},
    {"kv_lora_rank", "multi-head latent attention (DeepSeek MLA)"},
    {"qk_rope_head_dim", "multi-head latent attention (DeepSeek MLA)"},
    {"qk_nope_head_dim", "multi-head latent attention (DeepSeek MLA)"},
    {"v_head_dim", "multi-head latent attention (DeepSeek MLA)"},
    {"num_nextn_predict_layers", "multi-token prediction modules"},
    {"cross_attention_layers", "cross-attention layers"},
    {"vision_config", "a vision encoder"},
    {"text_config", "a multimodal model (nested text_config)"},
};

// Families whose config.json distplan maps field by field (docs/scenario.md; MoE and MLA
// families: docs/moe.md).
constexpr std::string_view kMappedTypes[] = {
    "llama",   "mistral", "qwen2",     "gpt2",        "gpt_neox",    "bloom",
    "qwen3",   "mixtral", "qwen2_moe", "qwen3_moe",   "deepseek_v2", "deepseek_v3",
    "kimi_k2", "gpt_oss", "gemma2",    "gemma3_text", "llama4_text"};

// Families that are not mapped, with what in them distplan does not model: the refusal names
// it rather than a field the family shares with mapped ones.
struct UnmappedFamily {
  const char* type;
  const char* why;
};
constexpr UnmappedFamily kUnmappedFamilies[] = {
    {"jamba", "Mamba state-space layers interleaved with attention"},
    {"olmoe", "q/k RMSNorms over the whole projected width (not per head)"},
    {"mamba", "state-space layers without attention"},
    {"mamba2", "state-space layers without attention"},
    {"qwen3_next", "gated linear-attention (Gated DeltaNet) layers"},
};

// A present field that turns the feature on: not null, not false, not 0, not "".
bool enabled(const json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0.0;
  if (v.is_string()) return !v.get<std::string>().empty();
  return true;
}

void refuse_unmodelled(const json& cfg, const std::string& path, const std::string& model_type) {
  // The family first: a family distplan does not map is refused for that, not for a field
  // (num_local_experts, ...) it shares with a mapped family.
  if (!model_type.empty()) {
    bool mapped = false;
    for (std::string_view t : kMappedTypes) mapped |= model_type == t;
    if (!mapped) {
      std::string why;
      for (const UnmappedFamily& f : kUnmappedFamilies) {
        if (model_type == f.type)
          why = fmt::format(": it has {}, which distplan does not model", f.why);
      }
      throw InputError(
          path + "/model_type",
          fmt::format("model_type '{}' is not mapped by distplan{} (mapped: llama, mistral, "
                      "qwen2, qwen3, gpt2, gpt_neox, bloom, mixtral, qwen2_moe, qwen3_moe, "
                      "deepseek_v2, deepseek_v3, kimi_k2, gpt_oss, gemma2, gemma3_text, "
                      "llama4_text; for gemma3 and llama4 pass their text_config); give the "
                      "model's fields instead of hf_config",
                      model_type.substr(0, 64), why));
    }
  }
  for (const UnsupportedField& f : kUnsupportedFields) {
    auto it = cfg.find(f.key);
    if (it == cfg.end() || !enabled(*it)) continue;
    if (detail::hf_family_maps(model_type, f.key)) continue;
    throw InputError(path + "/" + f.key,
                     fmt::format("{} = {} declares {}, which distplan does not model; it would "
                                 "be planned as a dense model with the wrong parameter count, so "
                                 "it is refused",
                                 f.key, it->dump().substr(0, 32), f.what));
  }
  auto flag = [&](const char* key, const char* what) {
    auto it = cfg.find(key);
    if (it != cfg.end() && enabled(*it))
      throw InputError(path + "/" + key, fmt::format("{} = {}: {} is not modelled by distplan", key,
                                                     it->dump().substr(0, 32), what));
  };
  // GPT-NeoX's attention_bias (default true) and gpt-oss's (true, with biased experts) are read
  // with the family (model_from_hf_config).
  if (model_type != "gpt_neox" && model_type != "gpt_oss")
    flag("attention_bias", "a bias on every attention projection including o_proj");
  flag("mlp_bias", "biases on the MLP projections only");
  // Llama 4's use_qk_norm is a weightless L2 norm (Llama4TextL2Norm): no parameters.
  if (model_type != "llama4_text") flag("use_qk_norm", "normalisation of queries and keys");
  flag("qk_layernorm", "normalisation of queries and keys");
  if (model_type.starts_with("qwen")) flag("use_sliding_window", "sliding-window attention");
  // Sliding windows are mapped for mistral, mixtral, gpt_oss and gemma (map_hf_attention); a
  // Llama config does not declare one.
  if (model_type == "llama") flag("sliding_window", "sliding-window attention");
}

enum class HfActivation { silu, gelu };
// A config.json activation (transformers activations.py ACT2FN names): silu/swish, or one of the
// GeLU variants (exact, tanh and sigmoid approximations have the same shapes and cost). Anything
// else, or a value that is not a name, is refused at the field.
HfActivation hf_activation(const json& cfg, const std::string& path, const char* key,
                           const char* fallback) {
  std::string act = fallback;
  if (auto it = cfg.find(key); it != cfg.end() && !it->is_null()) {
    if (!it->is_string()) {
      throw InputError(path + "/" + key, fmt::format("{} must be an activation name (a string), "
                                                     "not {}",
                                                     key, it->dump().substr(0, 32)));
    }
    act = it->get<std::string>();
  }
  if (act == "silu" || act == "swish" || act == "swiglu") return HfActivation::silu;
  for (const char* g : {"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python",
                        "gelu_accurate", "quick_gelu", "gelu_10"}) {
    if (act == g) return HfActivation::gelu;
  }
  std::string printable = act.substr(0, 32);
  std::erase_if(printable, [](char c) { return c < 0x20 || c > 0x7E; });
  throw InputError(path + "/" + key,
                   fmt::format("activation '{}' is not modelled: distplan's MLPs are GeLU, "
                               "SwiGLU (silu) or GeGLU (gelu)",
                               printable));
}

}  // namespace

ModelSpec model_from_json(const json& doc, std::string_view path) {
  return detail::read_model(doc, std::string(path));
}

ModelSpec model_from_hf_config(const json& cfg, std::string_view path_view) {
  const std::string path(path_view);
  if (cfg.is_string()) {
    // A library reads no files: the CLI's --hf-config does.
    std::string printable;
    for (char c : cfg.get<std::string>().substr(0, 64))
      printable += (c >= 0x20 && c < 0x7f) ? c : '?';
    throw InputError(path, fmt::format("hf_config holds the contents of a config.json (an object), "
                                       "not a file name; to read '{}', run distplan with "
                                       "--hf-config {} (or paste the file's object here)",
                                       printable, printable));
  }
  if (!cfg.is_object()) throw InputError(path, "hf_config must be a JSON object (a config.json)");
  // Field names per family (Hugging Face transformers configuration_*.py):
  //   Llama/Mistral/Qwen2: num_hidden_layers, hidden_size, num_attention_heads,
  //     num_key_value_heads, intermediate_size, vocab_size, max_position_embeddings,
  //     tie_word_embeddings, hidden_act=silu -> SwiGLU, RMSNorm, rotary.
  //   GPT-2: n_layer, n_embd, n_head, n_inner (default 4*n_embd), vocab_size, n_positions;
  //     LayerNorm, GeLU, learned positions, biases, tied embeddings.
  //   GPT-NeoX: num_hidden_layers, hidden_size, num_attention_heads, intermediate_size,
  //     vocab_size, max_position_embeddings, tie_word_embeddings (default false), rotary, GeLU,
  //     LayerNorm, biases.
  //   BLOOM (configuration_bloom.py, modeling_bloom.py): n_layer, hidden_size (older files:
  //     n_embed), n_head, vocab_size; an MLP of 4 * hidden_size whatever n_inner says (BloomMLP),
  //     GeLU, LayerNorm, biases, ALiBi, a LayerNorm of the word embeddings
  //     (word_embeddings_layernorm), tied embeddings (the default of tie_word_embeddings).
  auto get_int = [&](std::initializer_list<const char*> keys) -> std::optional<Count> {
    for (const char* k : keys) {
      auto it = cfg.find(k);
      if (it == cfg.end() || it->is_null()) continue;
      if (!it->is_number_integer() || it->get<Count>() <= 0 ||
          it->get<Count>() > (Count{1} << 26)) {
        throw InputError(path + "/" + k, fmt::format("{} must be a positive integer", k));
      }
      return it->get<Count>();
    }
    return std::nullopt;
  };
  auto require = [&](std::initializer_list<const char*> keys) -> Count {
    if (auto v = get_int(keys)) return *v;
    throw InputError(path, fmt::format("config.json lacks {}", *keys.begin()));
  };
  std::string model_type;
  if (auto it = cfg.find("model_type"); it != cfg.end() && it->is_string()) model_type = *it;
  refuse_unmodelled(cfg, path, model_type);
  const bool gpt2 = model_type == "gpt2" || cfg.contains("n_embd");
  const bool neox = model_type == "gpt_neox";
  const bool bloom = model_type == "bloom";
  ModelSpec m;
  model_type = model_type.substr(0, 32);
  // Only printable ASCII of model_type reaches the name (tables go to terminals).
  std::erase_if(model_type, [](char c) { return c < 0x20 || c > 0x7E; });
  m.name = model_type.empty() ? "hf_config" : "hf:" + model_type;
  if (bloom) {
    if (auto it = cfg.find("apply_residual_connection_post_layernorm");
        it != cfg.end() && enabled(*it)) {
      throw InputError(path + "/apply_residual_connection_post_layernorm",
                       "a residual taken after the norm is not modelled by distplan");
    }
    m.num_layers = require({"n_layer", "num_hidden_layers"});
    m.hidden_size = require({"hidden_size", "n_embed"});
    m.num_attention_heads = require({"n_head", "num_attention_heads"});
    m.num_kv_heads = m.num_attention_heads;
    m.ffn_hidden_size = 4 * m.hidden_size;
    m.vocab_size = require({"vocab_size"});
    m.mlp = Mlp::gelu;
    m.norm = Norm::layernorm;
    m.position_embedding = PositionEmbedding::alibi;
    m.embedding_norm = true;
    m.tied_embeddings = true;
    m.bias = true;
  } else if (gpt2) {
    // GPT2MLP: c_fc, act (activation_function, default gelu_new), c_proj; not gated.
    if (hf_activation(cfg, path, "activation_function", "gelu_new") != HfActivation::gelu) {
      throw InputError(path + "/activation_function",
                       "GPT-2's MLP is modelled with a GeLU activation only");
    }
    m.num_layers = require({"n_layer"});
    m.hidden_size = require({"n_embd"});
    m.num_attention_heads = require({"n_head"});
    m.num_kv_heads = m.num_attention_heads;
    m.ffn_hidden_size = get_int({"n_inner"}).value_or(4 * m.hidden_size);
    m.vocab_size = require({"vocab_size"});
    m.max_position_embeddings = get_int({"n_positions", "n_ctx"}).value_or(1024);
    m.mlp = Mlp::gelu;
    m.norm = Norm::layernorm;
    m.position_embedding = PositionEmbedding::learned;
    m.tied_embeddings = true;
    m.bias = true;
  } else {
    m.num_layers = require({"num_hidden_layers"});
    m.hidden_size = require({"hidden_size"});
    m.num_attention_heads = require({"num_attention_heads"});
    m.num_kv_heads = get_int({"num_key_value_heads"}).value_or(m.num_attention_heads);
    m.ffn_hidden_size = require({"intermediate_size"});
    m.vocab_size = require({"vocab_size"});
    m.max_position_embeddings = get_int({"max_position_embeddings"}).value_or(2048);
    m.position_embedding = PositionEmbedding::rotary;
    if (neox) {
      // GPTNeoXMLP: dense_h_to_4h, act, dense_4h_to_h (not gated), with biases; the attention's
      // query_key_value and dense take bias=config.attention_bias (default true; transformers
      // modeling_gpt_neox.py).
      if (hf_activation(cfg, path, "hidden_act", "gelu") != HfActivation::gelu) {
        throw InputError(path + "/hidden_act",
                         "GPT-NeoX's MLP is modelled with a GeLU activation only");
      }
      if (auto it = cfg.find("attention_bias"); it != cfg.end() && !it->is_null()) {
        if (!it->is_boolean())
          throw InputError(path + "/attention_bias", "attention_bias must be true or false");
        if (!it->get<bool>()) {
          throw InputError(path + "/attention_bias",
                           "attention_bias false leaves GPT-NeoX's MLP biases without the "
                           "attention's; biases on the MLP alone are not modelled by distplan");
        }
      }
      m.mlp = Mlp::gelu;
      m.norm = Norm::layernorm;
      m.bias = true;
      m.tied_embeddings = false;
    } else {
      // LlamaMLP, MistralMLP, Qwen2MLP, ...: gate_proj, up_proj and down_proj with
      // act_fn = ACT2FN[hidden_act], gated whatever the activation (transformers
      // modeling_llama.py): SwiGLU for silu, GeGLU for the GeLU variants.
      // Gemma names it hidden_activation (GemmaMLP reads it; gelu_pytorch_tanh).
      const bool gemma = model_type == "gemma2" || model_type == "gemma3_text";
      const char* act_key =
          gemma && cfg.contains("hidden_activation") ? "hidden_activation" : "hidden_act";
      m.mlp = hf_activation(cfg, path, act_key, gemma ? "gelu_pytorch_tanh" : "silu") ==
                      HfActivation::silu
                  ? Mlp::swiglu
                  : Mlp::geglu;
      m.norm = Norm::rmsnorm;
      m.bias = false;
      // Qwen2 (and Qwen2.5, which shares model_type qwen2) projects q, k and v with biases that
      // config.json does not announce (transformers models/qwen2/modeling_qwen2.py).
      m.qkv_bias = model_type == "qwen2" || model_type == "qwen2_moe";
      // Gemma ties the LM head to the embedding by default (GemmaConfig tie_word_embeddings).
      m.tied_embeddings = gemma;
      if (model_type == "gpt_oss") {
        // GptOssAttention's q, k, v and o projections take bias=config.attention_bias (true in
        // every release), and the experts and router have biases.
        auto it = cfg.find("attention_bias");
        if (it != cfg.end() && !(it->is_boolean() && it->get<bool>())) {
          throw InputError(path + "/attention_bias",
                           "gpt-oss without attention biases is not modelled (its experts keep "
                           "theirs)");
        }
        m.bias = true;
      }
      // Gemma 3's q_norm and k_norm over each head (Gemma3Attention), as Qwen3's.
      if (model_type == "gemma3_text") m.qk_norm = true;
    }
  }
  // An explicit head_dim other than hidden/heads (Mistral-Nemo, Qwen3) widens or narrows the
  // q, k, v and output projections (model.head_dim).
  if (auto it = cfg.find("head_dim"); it != cfg.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<Count>() < 1 || it->get<Count>() > (1 << 16))
      throw InputError(path + "/head_dim", "head_dim must be a positive integer");
    if (it->get<Count>() * m.num_attention_heads != m.hidden_size)
      m.explicit_head_dim = it->get<Count>();
  }
  detail::map_hf_moe_mla(cfg, path, model_type, m);
  detail::map_hf_attention(cfg, path, model_type, m);
  if (auto it = cfg.find("tie_word_embeddings"); it != cfg.end()) {
    if (!it->is_boolean()) throw InputError(path + "/tie_word_embeddings", "must be true or false");
    m.tied_embeddings = it->get<bool>();
  }
  // Rotary base and Llama-3 frequency scaling (transformers modeling_rope_utils.py, rope_type
  // "llama3"). Other scaling types change no memory or time but are not exported: refused.
  if (auto it = cfg.find("rope_theta"); it != cfg.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() < 1.0 || it->get<double>() > 1e12)
      throw InputError(path + "/rope_theta", "rope_theta must be a number between 1 and 1e12");
    m.rope_theta = it->get<double>();
  }
  if (auto it = cfg.find("rope_scaling"); it != cfg.end() && !it->is_null()) {
    const std::string p = path + "/rope_scaling";
    if (!it->is_object()) throw InputError(p, "rope_scaling must be an object or null");
    std::string type;
    for (const char* k : {"rope_type", "type"}) {
      if (auto t = it->find(k); t != it->end() && t->is_string()) type = t->get<std::string>();
    }
    if (type == "default") return m;
    // YaRN (DeepSeek-V2/V3) rescales rotary frequencies and the attention softmax; it changes
    // no shape, and those families are not planned or exported yet (docs/moe.md).
    if (type == "yarn" && detail::hf_family_accepts_yarn(model_type)) return m;
    // Gemma 3's linear position interpolation (rope_type "linear", factor 8 on its global
    // layers) changes no shape either.
    if (type == "linear" && model_type == "gemma3_text") return m;
    if (type != "llama3") {
      throw InputError(p, fmt::format("rope scaling type '{}' is not modelled; only \"llama3\" is",
                                      type.substr(0, 32)));
    }
    auto f = it->find("factor");
    if (f == it->end() || !f->is_number() || f->get<double>() < 1.0 || f->get<double>() > 1024.0)
      throw InputError(p + "/factor", "factor must be a number between 1 and 1024");
    m.rope_scaling_factor = f->get<double>();
  }
  return m;
}

namespace {

// The document read into a scenario, defaults filled, not yet validated.
Scenario read_scenario(const json& doc, std::initializer_list<std::string_view> extra_keys) {
  ObjectReader top(doc, "");
  Scenario s;
  // Every known top-level key is taken before a required one is found missing, so that a
  // misspelt required key is reported as such (ObjectReader::missing).
  const json* model = top.take("model");
  const json* training = top.take("training");
  const json* cluster = top.take("cluster");
  const json* parallel = top.take("parallel");
  const json* assumptions = top.take("assumptions");
  top.take("schema");  // an echoed scenario may carry the document's schema tag
  if (!model) top.missing("model", "model is required (a preset name or an object)");

  // Model.
  s.model = detail::read_model(*model, "/model");

  // Training (read before the model defaults that depend on it).
  if (!training) {
    top.missing("training", "training is required (seq_length, global_batch_size, ...)");
  }
  {
    ObjectReader r(*training, "/training");
    TrainingSpec& t = s.training;
    const auto seq = r.integer("seq_length", 1, Count{1} << 22);
    const auto gbs = r.integer("global_batch_size", 1, Count{1} << 32);
    if (auto v = r.integer("micro_batch_size", 1, Count{1} << 24)) t.micro_batch_size = *v;
    // "fp8": the layers' GEMMs in fp8 with a scaling recipe, everything else in bf16.
    if (const auto i = r.choice("precision", {"fp32", "fp16", "bf16", "fp8"})) {
      t.precision = *i == 3 ? DType::bf16 : static_cast<DType>(*i);
      if (*i == 3) t.fp8 = Fp8Recipe::delayed;
    }
    if (r.has("fp8_recipe")) {
      const bool fp8 = t.fp8 != Fp8Recipe::none;
      Fp8Recipe recipe = Fp8Recipe::none;
      read_enum(r, "fp8_recipe", recipe, {"none", "delayed", "current", "blockwise", "mxfp8"});
      if (fp8 && recipe == Fp8Recipe::none) {
        throw InputError(r.child("fp8_recipe"),
                         "precision fp8 needs a recipe: delayed, current, blockwise or mxfp8");
      }
      if (!fp8 && recipe != Fp8Recipe::none) {
        throw InputError(r.child("fp8_recipe"), "fp8_recipe needs precision \"fp8\"");
      }
      t.fp8 = recipe;
    }
    read_enum(r, "optimizer", t.optimizer, {"adamw", "adam", "sgd"});
    // The framework the plan assumes; megatron when absent (docs/scenario.md). "fsdp2" is
    // torchtitan's former name here and stays accepted.
    t.framework = Framework::megatron;
    if (const auto i =
            r.choice("framework", {"generic", "megatron", "deepspeed", "torchtitan", "fsdp2"})) {
      t.framework = *i == 4 ? Framework::torchtitan : static_cast<Framework>(*i);
    }
    s.assumptions.framework_profile = framework_profile(t.framework);
    // A framework that keeps fp32 gradients under bf16 sets the default (docs/memory.md).
    const bool fp32_grads =
        s.assumptions.framework_profile.fp32_gradients_with_bf16 && t.precision == DType::bf16;
    t.grad_accumulation_dtype =
        read_dtype(r, "grad_accumulation_dtype", fp32_grads ? DType::fp32 : t.precision);
    read_enum(r, "attention", t.attention, {"flash", "standard"});
    if (auto v = r.number("dropout", 0.0, 0.999, false)) t.dropout = *v;
    // Time conventions of the framework (docs/time.md, "Kernel fusion"): torchtitan and FSDP
    // runs are eager PyTorch unless compiled; Megatron-LM, DeepSpeed's Megatron and generic use
    // fused kernels.
    t.kernels = t.framework == Framework::torchtitan ? Kernels::eager : Kernels::fused;
    read_enum(r, "kernels", t.kernels, {"fused", "compiled", "eager"});
    if (auto v = r.boolean("cuda_graphs")) t.cuda_graphs = *v;
    if (r.has("optimizer_state_dtype")) {
      t.optimizer_state_dtype = read_dtype(r, "optimizer_state_dtype", DType::fp32);
      if (t.optimizer_state_dtype == DType::fp16) {
        throw InputError(r.child("optimizer_state_dtype"),
                         "optimizer states are fp32 or bf16 (Apex DistributedFusedAdam's dtype)");
      }
    }
    if (const json* peft = r.take("peft")) detail::read_peft(*peft, r.child("peft"), s.model, t);
    if (!seq) r.missing("seq_length", "seq_length is required");
    if (!gbs) r.missing("global_batch_size", "global_batch_size is required");
    t.seq_length = *seq;
    t.global_batch_size = *gbs;
    r.finish();
  }
  if (s.model.position_embedding == PositionEmbedding::learned &&
      s.model.max_position_embeddings == 0) {
    s.model.max_position_embeddings = s.training.seq_length;
  }

  // Cluster.
  if (!cluster) top.missing("cluster", "cluster is required (gpu, num_gpus, ...)");
  bool num_gpus_given = false;
  {
    ObjectReader r(*cluster, "/cluster");
    ClusterSpec& c = s.cluster;
    const json* gpu = r.take("gpu");
    if (!gpu) {
      for (std::string_view k :
           {"num_gpus", "gpus_per_node", "intra_node_bandwidth", "inter_node_bandwidth",
            "intra_node_latency", "inter_node_latency", "runtime_reserve_bytes",
            "host_memory_bytes", "nvme_bandwidth", "nvlink_domain_size", "power_limit_watts"}) {
        r.take(k);
      }
      r.missing("gpu", "gpu is required (a preset name or an object)");
    }
    c.gpu = detail::read_gpu(*gpu, "/cluster/gpu");
    if (auto v = r.integer("num_gpus", 1, Count{1} << 24)) c.num_gpus = *v, num_gpus_given = true;
    c.gpus_per_node = r.integer("gpus_per_node", 1, 1024).value_or(c.gpu.gpus_per_node);
    constexpr double kMaxBw = 1e15;
    c.intra_node_bandwidth = r.number("intra_node_bandwidth", kMinBandwidth, kMaxBw, false)
                                 .value_or(c.gpu.intra_node_bandwidth);
    c.inter_node_bandwidth = r.number("inter_node_bandwidth", kMinBandwidth, kMaxBw, false)
                                 .value_or(c.gpu.inter_node_bandwidth);
    c.intra_node_latency = r.number("intra_node_latency", 0, 1.0, false).value_or(5e-6);
    c.inter_node_latency = r.number("inter_node_latency", 0, 1.0, false).value_or(1e-5);
    c.runtime_reserve_bytes = r.integer("runtime_reserve_bytes", 0, Count{1} << 50)
                                  .value_or(s.training.framework == Framework::generic
                                                ? Count{2} << 30
                                                : ClusterSpec::kRuntimeFromProfile);
    if (auto v = r.integer("host_memory_bytes", 0, Count{1} << 56)) c.host_memory_bytes = *v;
    if (auto v = zero_or_at_least(r, "nvme_bandwidth", kMinBandwidth, kMaxBw, "no NVMe offload"))
      c.nvme_bandwidth = *v;
    // The NVLink fabric: a node unless the GPU's system joins more (GB200 NVL72's 72 GPUs over
    // 18 trays of 4); groups inside it use the intra-node link (docs/layout.md).
    c.nvlink_domain_size = r.integer("nvlink_domain_size", 1, Count{1} << 20)
                               .value_or(std::max(c.gpus_per_node, c.gpu.nvlink_domain_gpus));
    if (c.nvlink_domain_size < c.gpus_per_node || c.nvlink_domain_size % c.gpus_per_node != 0) {
      throw InputError(r.child("nvlink_domain_size"),
                       fmt::format("the NVLink domain must be a whole number of nodes of {} GPUs, "
                                   "got {}",
                                   c.gpus_per_node, c.nvlink_domain_size));
    }
    c.power_limit_watts =
        r.number("power_limit_watts", 0, 1e5, false)
            .value_or(c.gpu.power_limit_watts > 0 ? c.gpu.power_limit_watts : c.gpu.tdp_watts);
    r.finish();
  }

  // Parallel layout.
  {
    ParallelSpec& p = s.parallel;
    bool dp_given = false;
    if (parallel) {
      ObjectReader r(*parallel, "/parallel");
      if (auto v = r.integer("tp", 1, Count{1} << 16)) p.tp = *v;
      if (auto v = r.integer("pp", 1, Count{1} << 16)) p.pp = *v;
      if (auto v = r.integer("dp", 1, Count{1} << 24)) p.dp = *v, dp_given = true;
      if (auto v = r.integer("ep", 1, Count{1} << 20)) p.ep = *v;
      if (auto v = r.integer("etp", 1, Count{1} << 16)) p.etp = *v;
      if (auto v = r.integer("zero_stage", 0, 3)) p.zero_stage = static_cast<int>(*v);
      if (auto v = r.integer("fsdp_shard_size", 1, Count{1} << 24)) p.fsdp_shard_size = *v;
      if (auto v = r.boolean("sequence_parallel")) p.sequence_parallel = *v;
      read_enum(r, "recompute", p.recompute, {"none", "selective", "full", "selective_op"});
      read_enum(r, "schedule", p.schedule,
                {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_h2", "zb_v", "v_half", "v_min",
                 "dualpipe_v", "zb_auto", "dualpipe"});
      if (auto v = r.integer("virtual_stages", 1, 1024)) {
        p.virtual_stages = *v;
        if (two_chunks(p.schedule) && *v != 2) {
          throw InputError("/parallel/virtual_stages",
                           fmt::format("schedule {} places exactly two chunks on each stage; "
                                       "virtual_stages must be 2 or omitted, not {}",
                                       to_string(p.schedule), *v));
        }
      } else if (two_chunks(p.schedule)) {
        // Implied by the V (chunks s and 2p - 1 - s on stage s) and by DualPipe (model stages s
        // and p - 1 - s on stage s).
        p.virtual_stages = 2;
      }
      if (auto v = r.integer("cp", 1, Count{1} << 16)) p.cp = *v;
      read_enum(r, "cp_comm", p.cp_comm, {"p2p", "all_gather", "a2a"});
      read_enum(r, "offload_optimizer", p.offload_optimizer, {"none", "cpu", "nvme"});
      read_enum(r, "offload_params", p.offload_params, {"none", "cpu", "nvme"});
      if (const json* l = r.take("layers_per_stage")) {
        p.layers_per_stage = read_count_list(*l, "/parallel/layers_per_stage");
        // An empty list would read as "absent" (an even split): say so instead of guessing.
        if (p.layers_per_stage.empty())
          throw InputError("/parallel/layers_per_stage",
                           "must list one layer count per pipeline stage; omit the field for an "
                           "even split");
      }
      if (const json* l = r.take("layers_per_virtual_stage")) {
        p.split.rule = SplitRule::explicit_layers;
        p.split.layers = read_count_list(*l, "/parallel/layers_per_virtual_stage");
        if (p.split.layers.empty())
          throw InputError("/parallel/layers_per_virtual_stage",
                           "must list one layer count per virtual stage; omit the field for an "
                           "even split");
      }
      if (const json* x = r.take("pipeline_split")) {
        if (p.split.rule == SplitRule::explicit_layers)
          throw InputError("/parallel/pipeline_split",
                           "give either layers_per_virtual_stage or pipeline_split, not both");
        read_pipeline_split(*x, p.split);
      }
      if (auto v = r.integer("zb_memory_limit_microbatches", 1, Count{1} << 24))
        p.zb_memory_limit_microbatches = *v;
      r.finish();
    }
    Count& n = s.cluster.num_gpus;
    if (!num_gpus_given) {
      n = p.tp * p.cp * p.pp * p.dp;
    } else if (!dp_given) {
      if (n % (p.tp * p.cp * p.pp) != 0) {
        throw InputError("/parallel",
                         fmt::format("num_gpus={} is not divisible by tp*cp*pp={}*{}*{}={}", n,
                                     p.tp, p.cp, p.pp, p.tp * p.cp * p.pp));
      }
      p.dp = n / (p.tp * p.cp * p.pp);
    }
    if (p.fsdp_shard_size == 0) p.fsdp_shard_size = p.dp;
  }

  // Assumptions.
  if (const json* a = assumptions) {
    ObjectReader r(*a, "/assumptions");
    Assumptions& x = s.assumptions;
    // 0 keeps the GPU preset's figure (docs/assumptions.md); any other value is at least
    // kMinEfficiency, so every time stays finite.
    auto preset_or_efficiency = [&](std::string_view key, double& out) {
      if (auto v = r.number(key, 0, 1, false)) {
        if (*v != 0 && *v < kMinEfficiency) {
          throw InputError(r.child(key), fmt::format("must be 0 (the GPU preset's figure) or at "
                                                     "least {}, got {}",
                                                     kMinEfficiency, *v));
        }
        out = *v;
      }
    };
    preset_or_efficiency("compute_efficiency", x.compute_efficiency);
    preset_or_efficiency("memory_efficiency", x.memory_efficiency);
    preset_or_efficiency("fp8_compute_efficiency", x.fp8_compute_efficiency);
    if (auto v = r.number("communication_efficiency", kMinEfficiency, 1, false))
      x.communication_efficiency = *v;
    if (auto v = r.integer("nccl_half_bandwidth_bytes", 0, Count{1} << 40))
      x.nccl_half_bandwidth_bytes = *v;
    if (auto v = r.number("kernel_launch_seconds", 0, 1e-2, false)) x.kernel_launch_seconds = *v;
    if (auto v = r.number("overlap_compute_slowdown", 0, 1, false)) x.overlap_compute_slowdown = *v;
    if (auto v = r.boolean("tp_comm_overlap")) x.tp_comm_overlap = *v;
    if (auto v = r.boolean("overlap_p2p")) x.overlap_p2p = *v;
    if (auto v = r.boolean("p2p_scatter_gather")) x.p2p_scatter_gather = *v;
    if (auto v = r.boolean("overlap_param_gather_after_step"))
      x.overlap_param_gather_after_step = *v;
    if (auto v = r.boolean("tree_all_reduce")) x.tree_all_reduce = *v;
    if (auto v = r.integer("zero3_prefetch_layers", 0, 64)) x.zero3_prefetch_layers = *v;
    if (auto v = r.boolean("overlap_grad_reduce")) x.overlap_grad_reduce = *v;
    if (auto v = r.boolean("overlap_param_gather")) x.overlap_param_gather = *v;
    if (auto v = r.integer("vocab_pad_multiple", 1, 1 << 16)) x.vocab_pad_multiple = *v;
    if (auto v = r.number("moe_load_imbalance", 1, 1024, false)) x.moe_load_imbalance = *v;
    if (const json* fp = r.take("framework_profile"))
      detail::read_framework_profile(*fp, r.child("framework_profile"), x.framework_profile);
    if (auto v = r.number("pcie_efficiency", kMinEfficiency, 1, false)) x.pcie_efficiency = *v;
    if (auto v = r.number("cpu_optimizer_bandwidth", kMinBandwidth, 1e15, false))
      x.cpu_optimizer_bandwidth = *v;
    if (auto v = r.integer("nvme_optimizer_buffer_count", 1, 1024))
      x.nvme_optimizer_buffer_count = *v;
    if (auto v = r.integer("nvme_sub_group_params", 1, Count{1} << 40))
      x.nvme_sub_group_params = *v;
    if (auto v = r.integer("nvme_param_buffer_count", 1, 1024)) x.nvme_param_buffer_count = *v;
    if (auto v = r.integer("nvme_param_buffer_params", 1, Count{1} << 40))
      x.nvme_param_buffer_params = *v;
    if (auto v = r.integer("fp8_amax_history_len", 1, Count{1} << 20)) x.fp8_amax_history_len = *v;
    if (auto v = r.number("clock_power_exponent", 0, 1, false)) x.clock_power_exponent = *v;
    if (auto v = r.number("grouped_gemm_efficiency", kMinEfficiency, 1, false))
      x.grouped_gemm_efficiency = *v;
    r.finish();
  }
  if (top.has("search") &&
      std::find(extra_keys.begin(), extra_keys.end(), "search") == extra_keys.end()) {
    throw InputError("/search",
                     "a search object is read by `distplan search`; a plan takes one "
                     "layout (docs/search.md)");
  }
  top.finish(extra_keys);
  return s;
}

}  // namespace

Scenario scenario_from_json(const json& doc, std::initializer_list<std::string_view> extra_keys) {
  Scenario s = read_scenario(doc, extra_keys);
  validate_scenario(s);
  return s;
}

Scenario scenario_for_training(const json& doc,
                               std::initializer_list<std::string_view> extra_keys) {
  Scenario s = read_scenario(doc, extra_keys);
  validate_scenario(s, /*refuse_unplanned=*/false);
  return s;
}

Scenario scenario_from_text(std::string_view text,
                            std::initializer_list<std::string_view> extra_keys) {
  return scenario_from_json(parse_json_text(text), extra_keys);
}

Scenario default_scenario() {
  return scenario_from_text(default_scenario_text());
}

json to_json(const ModelSpec& m) {
  json j = {{"name", m.name},
            {"num_layers", m.num_layers},
            {"hidden_size", m.hidden_size},
            {"num_attention_heads", m.num_attention_heads},
            {"num_kv_heads", m.num_kv_heads},
            {"ffn_hidden_size", m.ffn_hidden_size},
            {"vocab_size", m.vocab_size},
            {"mlp", to_string(m.mlp)},
            {"norm", to_string(m.norm)},
            {"position_embedding", to_string(m.position_embedding)},
            {"rope_theta", m.rope_theta},
            {"rope_scaling_factor", m.rope_scaling_factor},
            {"tied_embeddings", m.tied_embeddings},
            {"bias", m.bias},
            {"qkv_bias", m.qkv_bias}};
  // Rotary models need no table length; 0 (unset) is not a valid input, so it is left out and the
  // echo reads back to the same model.
  if (m.max_position_embeddings > 0) j["max_position_embeddings"] = m.max_position_embeddings;
  if (m.embedding_norm) j["embedding_norm"] = true;
  detail::put_moe_mla_fields(m, j);
  detail::put_attention_fields(m, j);
  return j;
}

json to_json(const GpuSpec& g) {
  json pf = {{"fp32", g.peak_flops.fp32}, {"tf32", g.peak_flops.tf32},
             {"fp16", g.peak_flops.fp16}, {"bf16", g.peak_flops.bf16},
             {"fp8", g.peak_flops.fp8},   {"mxfp8", g.peak_flops.mxfp8}};
  return {{"name", g.name},
          {"memory_bytes", g.memory_bytes},
          {"peak_flops", pf},
          {"memory_bandwidth", g.memory_bandwidth},
          {"intra_node_bandwidth", g.intra_node_bandwidth},
          {"inter_node_bandwidth", g.inter_node_bandwidth},
          {"gpus_per_node", g.gpus_per_node},
          {"sm_count", g.sm_count},
          {"gemm_efficiency", g.gemm_efficiency},
          {"gemm_k_overhead", g.gemm_k_overhead},
          {"memory_efficiency", g.memory_efficiency},
          {"flash_forward_efficiency", g.flash_forward_efficiency},
          {"flash_backward_efficiency", g.flash_backward_efficiency},
          {"pcie_bandwidth", g.pcie_bandwidth},
          {"fp8_gemm_efficiency", g.fp8_gemm_efficiency},
          {"mxfp8_gemm_efficiency", g.mxfp8_gemm_efficiency},
          {"sdpa_forward_efficiency", g.sdpa_forward_efficiency},
          {"sdpa_backward_efficiency", g.sdpa_backward_efficiency},
          {"tdp_watts", g.tdp_watts},
          {"power_limit_watts", g.power_limit_watts},
          {"nvlink_domain_gpus", g.nvlink_domain_gpus}};
}

json to_json(const ParallelSpec& p) {
  json j = {{"tp", p.tp},
            {"pp", p.pp},
            {"dp", p.dp},
            {"zero_stage", p.zero_stage},
            {"fsdp_shard_size", p.fsdp_shard_size},
            {"sequence_parallel", p.sequence_parallel},
            {"recompute", to_string(p.recompute)},
            {"schedule", to_string(p.schedule)},
            {"virtual_stages", p.virtual_stages},
            {"cp", p.cp},
            {"cp_comm", to_string(p.cp_comm)},
            {"offload_optimizer", to_string(p.offload_optimizer)},
            {"offload_params", to_string(p.offload_params)}};
  if (!p.layers_per_stage.empty()) j["layers_per_stage"] = p.layers_per_stage;
  if (p.split.rule == SplitRule::explicit_layers) {
    j["layers_per_virtual_stage"] = p.split.layers;
  } else if (p.split.rule != SplitRule::even) {
    j["pipeline_split"] = to_json(p.split);
  }
  if (p.zb_memory_limit_microbatches > 0)
    j["zb_memory_limit_microbatches"] = p.zb_memory_limit_microbatches;
  // Expert parallelism is echoed when used, so dense layouts read as before.
  if (p.ep != 1) j["ep"] = p.ep;
  if (p.etp != 1) j["etp"] = p.etp;
  return j;
}

json to_json(const Scenario& s) {
  const ClusterSpec& c = s.cluster;
  const TrainingSpec& t = s.training;
  const Assumptions& a = s.assumptions;
  json j = {
      {"model", to_json(s.model)},
      {"cluster",
       {{"gpu", to_json(c.gpu)},
        {"num_gpus", c.num_gpus},
        {"gpus_per_node", c.gpus_per_node},
        {"intra_node_bandwidth", c.intra_node_bandwidth},
        {"inter_node_bandwidth", c.inter_node_bandwidth},
        {"intra_node_latency", c.intra_node_latency},
        {"inter_node_latency", c.inter_node_latency},
        {"runtime_reserve_bytes", c.runtime_reserve_bytes},
        {"host_memory_bytes", c.host_memory_bytes},
        {"nvme_bandwidth", c.nvme_bandwidth},
        {"nvlink_domain_size", c.nvlink_domain_size},
        {"power_limit_watts", c.power_limit_watts}}},
      {"training",
       {{"seq_length", t.seq_length},
        {"global_batch_size", t.global_batch_size},
        {"micro_batch_size", t.micro_batch_size},
        {"precision", t.fp8 != Fp8Recipe::none ? std::string_view("fp8") : to_string(t.precision)},
        {"fp8_recipe", to_string(t.fp8)},  // "none" reads back without fp8
        {"optimizer", to_string(t.optimizer)},
        {"grad_accumulation_dtype", to_string(t.grad_accumulation_dtype)},
        {"attention", to_string(t.attention)},
        {"dropout", t.dropout},
        {"optimizer_state_dtype", to_string(t.optimizer_state_dtype)},
        {"kernels", to_string(t.kernels)},
        {"cuda_graphs", t.cuda_graphs}}},
      {"parallel", to_json(s.parallel)},
      {"assumptions",
       {{"compute_efficiency", a.compute_efficiency},
        {"memory_efficiency", a.memory_efficiency},
        {"fp8_compute_efficiency", a.fp8_compute_efficiency},
        {"communication_efficiency", a.communication_efficiency},
        {"nccl_half_bandwidth_bytes", a.nccl_half_bandwidth_bytes},
        {"kernel_launch_seconds", a.kernel_launch_seconds},
        {"overlap_compute_slowdown", a.overlap_compute_slowdown},
        {"tp_comm_overlap", a.tp_comm_overlap},
        {"overlap_p2p", a.overlap_p2p},
        {"p2p_scatter_gather", a.p2p_scatter_gather},
        {"overlap_param_gather_after_step", a.overlap_param_gather_after_step},
        {"tree_all_reduce", a.tree_all_reduce},
        {"zero3_prefetch_layers", a.zero3_prefetch_layers},
        {"overlap_grad_reduce", a.overlap_grad_reduce},
        {"overlap_param_gather", a.overlap_param_gather},
        {"vocab_pad_multiple", a.vocab_pad_multiple},
        {"moe_load_imbalance", a.moe_load_imbalance},
        {"pcie_efficiency", a.pcie_efficiency},
        {"cpu_optimizer_bandwidth", a.cpu_optimizer_bandwidth},
        {"nvme_optimizer_buffer_count", a.nvme_optimizer_buffer_count},
        {"nvme_sub_group_params", a.nvme_sub_group_params},
        {"nvme_param_buffer_count", a.nvme_param_buffer_count},
        {"nvme_param_buffer_params", a.nvme_param_buffer_params},
        {"fp8_amax_history_len", a.fp8_amax_history_len},
        {"clock_power_exponent", a.clock_power_exponent},
        {"grouped_gemm_efficiency", a.grouped_gemm_efficiency}}},
  };
  // A reserve computed from the framework's profile is not echoed (it depends on the layout);
  // the framework always is (every output names the framework it assumed), and its profile
  // when it is not generic's.
  if (c.runtime_reserve_bytes < 0) j["cluster"].erase("runtime_reserve_bytes");
  j["training"]["framework"] = to_string(t.framework);
  if (t.peft.enabled()) j["training"]["peft"] = detail::peft_json(t.peft);
  if (t.framework != Framework::generic || a.framework_profile != FrameworkProfile{})
    j["assumptions"]["framework_profile"] = detail::framework_profile_json(a.framework_profile);
  return j;
}

namespace {

// The plan's members are built in place (object_t::emplace), not from nested initializer lists,
// which copy every element: plan_many in the Python module builds one document per scenario.
void put(json::object_t& o, const char* key, json value) {
  o.emplace(key, std::move(value));
}

json stage_memory_json(const StageMemory& m) {
  json j(json::value_t::object);
  auto& o = j.get_ref<json::object_t&>();
  put(o, "stage", m.stage);
  put(o, "layers", json::array({m.first_layer, m.end_layer}));
  put(o, "num_layers", m.num_layers);
  // With several chunks per stage: each chunk's layers (pipeline_split.h).
  if (m.chunk_layers.size() > 1) put(o, "chunk_layers", m.chunk_layers);
  put(o, "parameters", m.parameters);
  put(o, "inflight_microbatches", m.inflight_microbatches);
  put(o, "inflight_chunks", m.inflight_chunks);
  put(o, "activation_bytes_per_microbatch", m.activation_bytes_per_microbatch);
  put(o, "weights_bytes", m.weights_bytes);
  put(o, "frozen_weights_bytes", m.frozen_weights_bytes);
  put(o, "gradients_bytes", m.gradients_bytes);
  put(o, "optimizer_bytes", m.optimizer_bytes);
  put(o, "activations_bytes", m.activations_bytes);
  put(o, "buffers_bytes", m.buffers_bytes);
  put(o, "runtime_bytes", m.runtime_bytes);
  put(o, "transient_bytes", m.transient_bytes);
  put(o, "allocated_bytes", m.allocated_bytes);
  put(o, "reserved_bytes", m.reserved_bytes);
  put(o, "total_bytes", m.total_bytes);
  put(o, "host_bytes", m.host_bytes);
  put(o, "nvme_bytes", m.nvme_bytes);
  return j;
}

json collective_json(const Collective& c) {
  json j(json::value_t::object);
  auto& o = j.get_ref<json::object_t&>();
  put(o, "group", to_string(c.group));
  put(o, "op", to_string(c.op));
  put(o, "link", to_string(c.link));
  put(o, "what", c.what());
  put(o, "group_size", c.group_size);
  put(o, "bytes_per_call", c.bytes_per_call);
  put(o, "calls_per_step", c.calls_per_step);
  put(o, "wire_bytes_per_gpu_per_step", c.wire_bytes_per_gpu_per_step);
  put(o, "seconds_per_step", c.seconds_per_step);
  return j;
}

json stage_costs_json(std::size_t stage, const StageCosts& k) {
  json j(json::value_t::object);
  auto& o = j.get_ref<json::object_t&>();
  put(o, "stage", stage);
  put(o, "forward_seconds", k.forward);
  put(o, "backward_input_seconds", k.backward_input);
  put(o, "backward_weight_seconds", k.backward_weight);
  put(o, "recompute_seconds", k.recompute);
  put(o, "tp_communication_seconds", k.tp_communication);
  put(o, "p2p_seconds", k.p2p);
  put(o, "cp_communication_seconds", k.cp_communication);
  put(o, "ep_communication_seconds", k.ep_communication);
  put(o, "zero3_gather_seconds", k.zero3_gather);
  put(o, "grad_reduce_seconds", k.grad_reduce);
  put(o, "param_gather_seconds", k.param_gather);
  put(o, "optimizer_seconds", k.optimizer);
  put(o, "wire_bytes_per_gpu_per_step", k.wire_bytes_per_step);
  if (k.chunks.size() > 1) {
    // Each chunk's share (pipeline_split.h): what the simulator times its passes with.
    json chunks = json::array();
    for (const ChunkCosts& c : k.chunks) {
      chunks.push_back({{"layers", c.layers},
                        {"forward_seconds", c.forward},
                        {"backward_input_seconds", c.backward_input},
                        {"backward_weight_seconds", c.backward_weight}});
    }
    put(o, "chunks", std::move(chunks));
  }
  return j;
}

constexpr std::pair<std::string_view, unsigned> kPlanParts[] = {
    {"schema", plan_schema},
    {"scenario", plan_scenario},
    {"model_summary", plan_model_summary},
    {"memory", plan_memory},
    {"communication", plan_communication},
    {"compute", plan_compute},
    {"stage_costs", plan_stage_costs},
    {"time", plan_time}};

}  // namespace

unsigned plan_part(std::string_view name) noexcept {
  for (const auto& [n, part] : kPlanParts) {
    if (n == name) return part;
  }
  return 0;
}

json interval_to_json(const ThroughputInterval& ti) {
  return {{"low", ti.low},
          {"high", ti.high},
          {"confidence", ti.confidence},
          {"kind", to_string(ti.kind)},
          {"pooled", ti.pooled},
          {"runs", ti.runs}};
}

json plan_to_json(const Scenario& s, const Estimate& e, unsigned parts) {
  json doc(json::value_t::object);
  auto& top = doc.get_ref<json::object_t&>();
  if (parts & plan_schema) put(top, "schema", "distplan.plan/v1");
  if (parts & plan_scenario) put(top, "scenario", to_json(s));
  if (parts & plan_model_summary) {
    json j(json::value_t::object);
    auto& o = j.get_ref<json::object_t&>();
    put(o, "parameters", e.parameters);
    const ParameterCount count = count_parameters(s.model);
    put(o, "active_parameters", count.active);
    put(o, "active_parameters_non_embedding", count.active_non_embedding);
    // As Hugging Face PEFT's print_trainable_parameters prints them (peft.h): trainable, and
    // all (the base plus the adapters).
    const PeftParameterCount pc = peft_parameter_count(
        s.model, planner_layer_table(s.model, s.training), s.training.peft, e.parameters);
    put(o, "trainable_parameters", pc.trainable);
    put(o, "all_parameters", pc.all);
    put(o, "padded_vocab_size", e.padded_vocab_size);
    put(o, "num_microbatches", e.num_microbatches);
    put(top, "model_summary", std::move(j));
  }
  if (parts & plan_memory) {
    json stages(json::value_t::array);
    auto& arr = stages.get_ref<json::array_t&>();
    arr.reserve(e.memory.stages.size());
    for (const StageMemory& m : e.memory.stages) arr.push_back(stage_memory_json(m));
    json j(json::value_t::object);
    auto& o = j.get_ref<json::object_t&>();
    put(o, "capacity_bytes", e.memory.capacity_bytes);
    put(o, "peak_bytes", e.memory.peak_bytes);
    put(o, "peak_allocated_bytes", e.memory.peak_allocated_bytes);
    put(o, "peak_reserved_bytes", e.memory.peak_reserved_bytes);
    put(o, "peak_stage", e.memory.peak_stage);
    put(o, "fits", e.memory.fits);
    put(o, "fits_compares", "peak_reserved_bytes");  // with capacity_bytes (docs/memory.md)
    put(o, "host_bytes_per_node", e.memory.host_bytes_per_node);
    put(o, "host_capacity_bytes", e.memory.host_capacity_bytes);
    put(o, "host_fits", e.memory.host_fits);
    put(o, "nvme_bytes_per_node", e.memory.nvme_bytes_per_node);
    put(o, "stages", std::move(stages));
    put(top, "memory", std::move(j));
  }
  if (parts & plan_communication) {
    json collectives(json::value_t::array);
    auto& arr = collectives.get_ref<json::array_t&>();
    arr.reserve(e.communication.collectives.size());
    for (const Collective& c : e.communication.collectives) arr.push_back(collective_json(c));
    json j(json::value_t::object);
    auto& o = j.get_ref<json::object_t&>();
    put(o, "wire_bytes_per_gpu_per_step", e.communication.wire_bytes_per_gpu_per_step);
    put(o, "collectives", std::move(collectives));
    put(top, "communication", std::move(j));
  }
  if (parts & plan_compute) {
    json j(json::value_t::object);
    auto& o = j.get_ref<json::object_t&>();
    // The MFU numerator's convention, named (docs/flops.md, "Conventions").
    put(o, "model_flops_convention", "causal_attention");
    put(o, "model_flops_per_step", e.compute.model_flops_per_step);
    put(o, "hardware_flops_per_step", e.compute.hardware_flops_per_step);
    put(top, "compute", std::move(j));
  }
  if (parts & plan_stage_costs) {
    json costs(json::value_t::array);
    auto& arr = costs.get_ref<json::array_t&>();
    arr.reserve(e.stage_costs.size());
    for (std::size_t i = 0; i < e.stage_costs.size(); ++i) {
      arr.push_back(stage_costs_json(i, e.stage_costs[i]));
    }
    put(top, "stage_costs", std::move(costs));
  }
  if (parts & plan_time) {
    json j(json::value_t::object);
    auto& o = j.get_ref<json::object_t&>();
    put(o, "engine", std::string(to_string(e.time.engine)));
    put(o, "step_seconds", e.time.step_seconds);
    put(o, "tokens_per_second", e.time.tokens_per_second);
    put(o, "mfu", e.time.mfu);
    put(o, "bubble_fraction", e.time.bubble_fraction);
    put(o, "compute_seconds", e.time.compute_seconds);
    put(o, "bubble_seconds", e.time.bubble_seconds);
    put(o, "exposed_communication_seconds", e.time.exposed_communication_seconds);
    put(o, "optimizer_seconds", e.time.optimizer_seconds);
    put(o, "offload",
        json{{"pcie_bytes_per_gpu_per_step", e.offload.pcie_bytes_per_gpu_per_step},
             {"nvme_bytes_per_node_per_step", e.offload.nvme_bytes_per_node_per_step},
             {"pcie_seconds", e.offload.pcie_seconds},
             {"nvme_seconds", e.offload.nvme_seconds},
             {"cpu_optimizer_seconds", e.offload.cpu_optimizer_seconds}});
    put(top, "time", std::move(j));
  }
  return doc;
}

json presets_to_json() {
  json out = {{"schema", "distplan.presets/v1"}};
  for (const auto& p : model_presets()) {
    const ModelSpec m = *find_model_preset(p.name);
    const ParameterCount c = count_parameters(m);
    json entry = {{"name", p.name},
                  {"description", p.description},
                  {"source", p.source},
                  {"model", to_json(m)},
                  {"parameters", c.total},
                  {"active_parameters", c.active},
                  {"active_parameters_non_embedding", c.active_non_embedding}};
    if (c.mtp > 0) entry["mtp_parameters"] = c.mtp;
    out["models"].push_back(std::move(entry));
  }
  for (const auto& p : gpu_presets()) {
    out["gpus"].push_back({{"name", p.name},
                           {"description", p.description},
                           {"source", p.source},
                           {"gpu", to_json(*find_gpu_preset(p.name))}});
  }
  return out;
}

}  // namespace distplan
