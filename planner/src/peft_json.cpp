// `training.peft` read and echoed (docs/peft.md, docs/scenario.md). Defaults are Hugging Face
// PEFT's (LoraConfig, peft/tuners/lora/config.py v0.20.0: r 8, lora_alpha 8, lora_dropout 0;
// target_modules from TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING, utils/constants.py)
// and the QLoRA paper's (Dettmers et al. 2023, sec. 3: NF4 with double quantization).
#include "peft_json.h"

#include <fmt/format.h>

#include "distplan/planner/error.h"
#include "distplan/planner/peft.h"

namespace distplan::detail {

using nlohmann::json;

namespace {

template <typename E>
bool read_choice(ObjectReader& r, std::string_view key, E& out,
                 std::initializer_list<std::string_view> names) {
  if (const auto i = r.choice(key, names)) {
    out = static_cast<E>(*i);
    return true;
  }
  return false;
}

DType dtype_of(BaseStorage s) noexcept {
  return s == BaseStorage::fp32 ? DType::fp32 : s == BaseStorage::fp16 ? DType::fp16 : DType::bf16;
}

}  // namespace

void read_peft(const json& doc, const std::string& path, const ModelSpec& m, TrainingSpec& t) {
  ObjectReader r(doc, path);
  PeftSpec& p = t.peft;
  if (!read_choice(r, "method", p.method, {"none", "full", "lora", "qlora"})) {
    r.missing("method", "method is required: lora, qlora or full (none: pre-training)");
  }
  const bool adapters = p.adapters();
  auto only_adapters = [&](std::string_view key) {
    if (r.has(key) && !adapters) {
      throw InputError(r.child(key), fmt::format("{} applies to method lora or qlora, not {}", key,
                                                 to_string(p.method)));
    }
  };
  for (std::string_view k : {"rank", "alpha", "dropout", "target_modules", "adapter_dtype"})
    only_adapters(k);
  p.rank = r.integer("rank", 1, Count{1} << 16).value_or(adapters ? 8 : 0);
  p.alpha = r.number("alpha", 0, 1e6, false).value_or(adapters ? 8.0 : 0.0);
  p.dropout = r.number("dropout", 0, 0.999, false).value_or(0.0);
  p.naming = default_peft_naming(m);
  read_choice(r, "module_names", p.naming, {"llama", "gpt2", "gpt_neox"});
  if (adapters) {
    if (const json* tm = r.take("target_modules")) {
      const std::string where = r.child("target_modules");
      if (tm->is_string() && *tm == "all-linear") {
        p.all_linear = true;
        p.targets = peft_all_linear_targets(p.naming, m);
      } else if (tm->is_array() && !tm->empty()) {
        std::vector<std::string> names;
        for (std::size_t i = 0; i < tm->size(); ++i) {
          if (!(*tm)[i].is_string())
            throw InputError(fmt::format("{}/{}", where, i), "must be a module name (a string)");
          names.push_back((*tm)[i].get<std::string>());
        }
        p.targets = peft_targets_from_names(p.naming, m, names, where);
      } else {
        throw InputError(where, "must be \"all-linear\" or a non-empty list of module names");
      }
    } else {
      // PEFT's per-model default: the attention's query and value (llama) or the fused qkv.
      p.targets = p.naming == PeftNaming::llama ? (peft_q | peft_v) : peft_qkv;
    }
  }
  const bool qlora = p.method == PeftMethod::qlora;
  const DType precision = t.precision;
  const BaseStorage float_storage = precision == DType::fp32   ? BaseStorage::fp32
                                    : precision == DType::fp16 ? BaseStorage::fp16
                                                               : BaseStorage::bf16;
  p.base_storage = qlora ? BaseStorage::nf4 : float_storage;
  read_choice(r, "base_storage", p.base_storage, {"fp32", "fp16", "bf16", "nf4", "fp4", "int8"});
  if (qlora && !p.quantized()) {
    throw InputError(r.child("base_storage"),
                     fmt::format("qlora quantizes the base: nf4, fp4 or int8, not {} (method lora "
                                 "trains adapters on a {} base)",
                                 to_string(p.base_storage), to_string(p.base_storage)));
  }
  if (!qlora && p.quantized()) {
    throw InputError(r.child("base_storage"),
                     fmt::format("a {} base is QLoRA: method qlora", to_string(p.base_storage)));
  }
  if (p.method == PeftMethod::full && p.base_storage != float_storage) {
    throw InputError(r.child("base_storage"),
                     "full fine-tuning keeps the weights it trains in training.precision");
  }
  const bool four_bit = p.base_storage == BaseStorage::nf4 || p.base_storage == BaseStorage::fp4;
  p.double_quant = four_bit;
  if (auto v = r.boolean("double_quant")) {
    if (*v && !four_bit) {
      throw InputError(r.child("double_quant"),
                       "double quantization applies to a 4-bit base (nf4, fp4)");
    }
    p.double_quant = *v;
  }
  if (r.has("compute_dtype")) {
    DType c = precision;
    read_choice(r, "compute_dtype", c, {"fp32", "fp16", "bf16"});
    if (c != precision) {
      throw InputError(r.child("compute_dtype"),
                       fmt::format("the layers run in training.precision ({}); "
                                   "bnb_4bit_compute_dtype must match",
                                   to_string(precision)));
    }
  }
  // PEFT's prepare_model_for_kbit_training casts every non-4-bit float parameter to fp32
  // (peft/utils/other.py): embeddings, LM head, norms and biases of a quantized base.
  p.base_dtype = p.quantized() ? DType::fp32 : dtype_of(p.base_storage);
  read_choice(r, "base_dtype", p.base_dtype, {"fp32", "fp16", "bf16"});
  p.adapter_dtype = DType::fp32;  // PEFT's autocast_adapter_dtype upcasts 16-bit adapters
  if (adapters) read_choice(r, "adapter_dtype", p.adapter_dtype, {"fp32", "fp16", "bf16"});
  if (auto v = r.integer("frozen_layers", 0, m.num_layers)) p.frozen_layers = *v;
  if (auto v = r.boolean("freeze_embeddings")) {
    if (!*v && adapters) {
      throw InputError(r.child("freeze_embeddings"),
                       "LoRA trains only its adapters: the embeddings stay frozen");
    }
    p.freeze_embeddings = *v;
  }
  if (adapters) p.freeze_embeddings = true;
  if (auto v = r.boolean("paged_optimizer")) p.paged_optimizer = *v;
  if (auto v = r.boolean("input_requires_grad")) p.input_requires_grad = *v;
  r.finish();
  if (p.method == PeftMethod::none) t.peft = PeftSpec{};
}

json peft_json(const PeftSpec& p) {
  json j = {{"method", to_string(p.method)}};
  if (!p.enabled()) return j;
  j["module_names"] = to_string(p.naming);
  if (p.adapters()) {
    j["rank"] = p.rank;
    j["alpha"] = p.alpha;
    j["dropout"] = p.dropout;
    if (p.all_linear) {
      j["target_modules"] = "all-linear";
    } else {
      json names = json::array();
      for (std::string_view n : peft_target_names(p.naming, p.targets)) names.push_back(n);
      j["target_modules"] = std::move(names);
    }
    j["adapter_dtype"] = to_string(p.adapter_dtype);
  }
  j["base_storage"] = to_string(p.base_storage);
  j["double_quant"] = p.double_quant;
  j["base_dtype"] = to_string(p.base_dtype);
  j["frozen_layers"] = p.frozen_layers;
  j["freeze_embeddings"] = p.freeze_embeddings;
  j["paged_optimizer"] = p.paged_optimizer;
  j["input_requires_grad"] = p.input_requires_grad;
  return j;
}

}  // namespace distplan::detail
