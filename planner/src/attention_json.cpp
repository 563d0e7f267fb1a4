// JSON of the attention-variant model fields (attention_json.h).
#include "attention_json.h"

#include <vector>

#include <fmt/format.h>

#include "distplan/planner/error.h"

namespace distplan::detail {

using nlohmann::json;

namespace {

void read_window(const json& doc, const std::string& path, AttentionWindowSpec& w) {
  ObjectReader r(doc, path);
  if (auto v = r.integer("size", 1, Count{1} << 24)) w.size = *v;
  if (auto i = r.choice("kind", {"sliding", "chunked"})) w.kind = static_cast<WindowKind>(*i);
  if (auto v = r.integer("full_every", 0, 100000)) w.full_every = *v;
  if (const json* l = r.take("layers")) {
    const std::string lp = r.child("layers");
    w.layers.clear();
    if (!l->is_null()) {
      if (!l->is_array()) throw InputError(lp, "must be an array of layer indices (from 0)");
      if (l->size() > 100000) throw InputError(lp, "lists more than 100000 layers");
      for (std::size_t i = 0; i < l->size(); ++i) {
        const json& v = (*l)[i];
        const std::string ip = fmt::format("{}/{}", lp, i);
        if (!v.is_number_integer() || v.get<Count>() < 0 || v.get<Count>() > 100000)
          throw InputError(ip, "must be an integer between 0 and 100000");
        if (!w.layers.empty() && v.get<Count>() <= w.layers.back())
          throw InputError(ip, "layer indices must be listed in increasing order, each once");
        w.layers.push_back(v.get<Count>());
      }
    }
  }
  if (w.size == 0) r.missing("size", "size (the window in tokens) is required");
  r.finish();
}

}  // namespace

void read_attention_fields(ObjectReader& r, ModelSpec& m) {
  if (const json* w = r.take("attention_window")) {
    if (w->is_null()) {
      m.attention_window = AttentionWindowSpec{};
    } else {
      read_window(*w, r.child("attention_window"), m.attention_window);
    }
  }
  if (auto v = r.boolean("attention_sinks")) m.attention_sinks = *v;
  if (auto v = r.number("attention_softcap", 0.0, 1e6, false)) m.attention_softcap = *v;
  if (auto v = r.number("final_logit_softcap", 0.0, 1e6, false)) m.final_logit_softcap = *v;
  if (auto v = r.boolean("sandwich_norm")) m.sandwich_norm = *v;
}

void check_attention_fields(const ModelSpec& m, const std::string& path) {
  const AttentionWindowSpec& w = m.attention_window;
  if (!w.enabled()) return;
  const std::string wp = path + "/attention_window";
  if (!w.layers.empty()) {
    if (w.full_every != 0) {
      throw InputError(wp + "/layers",
                       "an explicit list of windowed layers replaces full_every; give one or "
                       "the other");
    }
    if (w.layers.back() >= m.num_layers + m.mtp_layers) {
      throw InputError(wp + "/layers", fmt::format("layer {} is beyond the model's {} layers",
                                                   w.layers.back(), m.num_layers));
    }
  }
}

void put_attention_fields(const ModelSpec& m, json& j) {
  const AttentionWindowSpec& w = m.attention_window;
  if (w.enabled()) {
    j["attention_window"] = {{"size", w.size},
                             {"kind", w.kind == WindowKind::sliding ? "sliding" : "chunked"},
                             {"full_every", w.full_every}};
    if (!w.layers.empty()) j["attention_window"]["layers"] = w.layers;
  }
  if (m.attention_sinks) j["attention_sinks"] = true;
  if (m.attention_softcap > 0) j["attention_softcap"] = m.attention_softcap;
  if (m.final_logit_softcap > 0) j["final_logit_softcap"] = m.final_logit_softcap;
  if (m.sandwich_norm) j["sandwich_norm"] = true;
}

namespace {

// A positive integer window in config.json (null or absent: none).
Count hf_window(const json& cfg, const std::string& path, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return 0;
  if (!it->is_number_integer() || it->get<Count>() < 1 || it->get<Count>() > (Count{1} << 24))
    throw InputError(path + "/" + key, fmt::format("{} must be a positive integer or null", key));
  return it->get<Count>();
}

double hf_softcap(const json& cfg, const std::string& path, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return 0;
  if (!it->is_number() || it->get<double>() <= 0 || it->get<double>() > 1e6)
    throw InputError(path + "/" + key, fmt::format("{} must be a positive number or null", key));
  return it->get<double>();
}

}  // namespace

void map_hf_attention(const json& cfg, const std::string& path, std::string_view t, ModelSpec& m) {
  AttentionWindowSpec& w = m.attention_window;
  const bool gemma = t == "gemma2" || t == "gemma3_text";
  if (t == "llama4_text") {
    // Llama4TextAttention (transformers modeling_llama4.py): layers with RoPE attend within
    // chunks of attention_chunk_size (default 8192); every no_rope_layer_interval-th layer
    // (default 4) is a NoPE layer with full attention (configuration_llama4.py, layer_types).
    w.size = hf_window(cfg, path, "attention_chunk_size");
    if (cfg.find("attention_chunk_size") == cfg.end()) w.size = 8192;
    w.kind = WindowKind::chunked;
    w.full_every = 4;
    if (auto it = cfg.find("no_rope_layer_interval"); it != cfg.end() && !it->is_null()) {
      if (!it->is_number_integer() || it->get<Count>() < 1 || it->get<Count>() > 100000)
        throw InputError(path + "/no_rope_layer_interval", "must be a positive integer");
      w.full_every = it->get<Count>();
    }
  } else if (t == "mistral" || t == "mixtral" || t == "gpt_oss" || gemma) {
    // MistralAttention / MixtralAttention: sliding_window on every layer (Mistral-7B-v0.1: 4096;
    // later releases null). gpt-oss and Gemma 2/3 alternate it with full attention
    // (modeling_gpt_oss.py and modeling_gemma2.py: even layers sliding; Gemma 3: five of each
    // six, sliding_window_pattern).
    w.size = hf_window(cfg, path, "sliding_window");
    w.kind = WindowKind::sliding;
    w.full_every = t == "gpt_oss" || t == "gemma2" ? 2 : t == "gemma3_text" ? 6 : 0;
    if (t == "gemma3_text") {
      if (auto it = cfg.find("sliding_window_pattern"); it != cfg.end() && !it->is_null()) {
        if (!it->is_number_integer() || it->get<Count>() < 1 || it->get<Count>() > 100000)
          throw InputError(path + "/sliding_window_pattern", "must be a positive integer");
        w.full_every = it->get<Count>();
      }
    }
  }
  // layer_types (transformers >= 4.54) lists each layer's attention; it overrides the rule.
  if (auto it = cfg.find("layer_types"); it != cfg.end() && !it->is_null()) {
    const std::string lp = path + "/layer_types";
    if (!it->is_array() || static_cast<Count>(it->size()) != m.num_layers)
      throw InputError(lp, fmt::format("must list one type per layer ({})", m.num_layers));
    std::vector<Count> windowed;
    for (std::size_t i = 0; i < it->size(); ++i) {
      const json& v = (*it)[i];
      const std::string type = v.is_string() ? v.get<std::string>() : std::string();
      if (type == "full_attention") continue;
      const bool sliding = type == "sliding_attention";
      if (!sliding && type != "chunked_attention") {
        std::string printable = v.dump().substr(0, 32);
        throw InputError(fmt::format("{}/{}", lp, i),
                         fmt::format("layer type {} is not modelled (distplan models "
                                     "full_attention, sliding_attention and "
                                     "chunked_attention)",
                                     printable));
      }
      if ((sliding ? WindowKind::sliding : WindowKind::chunked) != w.kind && !windowed.empty())
        throw InputError(fmt::format("{}/{}", lp, i), "sliding and chunked layers mixed");
      w.kind = sliding ? WindowKind::sliding : WindowKind::chunked;
      windowed.push_back(static_cast<Count>(i));
    }
    if (windowed.empty()) {
      w = AttentionWindowSpec{};
    } else {
      if (w.size == 0) {
        throw InputError(
            path + (w.kind == WindowKind::sliding ? "/sliding_window" : "/attention_chunk_size"),
            "layer_types lists windowed layers but the window size is not given");
      }
      w.full_every = 0;
      w.layers = std::move(windowed);
    }
  }
  if (!w.enabled()) w = AttentionWindowSpec{};
  if (t == "gpt_oss") m.attention_sinks = true;  // GptOssAttention.sinks, one per head
  if (gemma) {
    // Gemma2DecoderLayer / Gemma3DecoderLayer: input, post-attention, pre- and post-feedforward
    // RMSNorms; tanh softcaps on the scores and the final logits (Gemma 2: 50 and 30).
    m.sandwich_norm = true;
    m.attention_softcap = hf_softcap(cfg, path, "attn_logit_softcapping");
    m.final_logit_softcap = hf_softcap(cfg, path, "final_logit_softcapping");
  }
}

}  // namespace distplan::detail
