// Structure-aware libFuzzer target: the bytes choose every field of a scenario from the ranges the
// reader admits (and a little beyond), so most inputs are well-formed JSON that reaches estimate(),
// the table view and simulate() with extreme but valid sizes (pipeline.h says what a finding is).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <fuzzer/FuzzedDataProvider.h>
#include <nlohmann/json.hpp>

#include "pipeline.h"

namespace {

using nlohmann::json;

// Small values most of the time (layouts that validate), the whole range sometimes.
std::int64_t size(FuzzedDataProvider& p, std::int64_t lo, std::int64_t hi) {
  switch (p.ConsumeIntegralInRange(0, 3)) {
    case 0:
      return std::int64_t{1} << p.ConsumeIntegralInRange(0, 12);
    case 1:
      return p.ConsumeIntegralInRange<std::int64_t>(lo, std::min<std::int64_t>(hi, 64));
    default:
      return p.ConsumeIntegralInRange<std::int64_t>(lo, hi);
  }
}

template <std::size_t N>
const char* pick(FuzzedDataProvider& p, const char* const (&names)[N]) {
  return names[p.ConsumeIntegralInRange<std::size_t>(0, N - 1)];
}

json make_scenario(FuzzedDataProvider& p) {
  static const char* const kModels[] = {"tiny-gpt",   "tiny-llama",    "gpt3-1.3b", "llama2-7b",
                                        "llama2-70b", "llama3.1-405b", "gpt3-175b", "mistral-7b"};
  static const char* const kGpus[] = {"a100-40gb", "h100-sxm-80gb", "b200-192gb", "l40s-48gb",
                                      "mi300x-192gb"};
  json doc;
  if (p.ConsumeBool()) {
    doc["model"] = pick(p, kModels);
  } else {
    const std::int64_t heads = size(p, 1, 1 << 10);
    const std::int64_t head_dim = size(p, 1, 512);
    doc["model"] = {{"num_layers", size(p, 1, 100000)},
                    {"hidden_size", heads * head_dim},
                    {"num_attention_heads", heads},
                    {"num_kv_heads", p.ConsumeBool() ? heads : size(p, 1, heads)},
                    {"ffn_hidden_size", size(p, 1, 1 << 22)},
                    {"vocab_size", size(p, 1, 1 << 26)},
                    {"mlp", p.ConsumeBool() ? "gelu" : "swiglu"},
                    {"norm", p.ConsumeBool() ? "layernorm" : "rmsnorm"},
                    {"position_embedding", p.ConsumeBool() ? "learned" : "rotary"},
                    {"tied_embeddings", p.ConsumeBool()},
                    {"bias", p.ConsumeBool()}};
  }
  const std::int64_t tp = size(p, 1, 1 << 16), pp = size(p, 1, 1 << 16), dp = size(p, 1, 1 << 24);
  const std::int64_t mbs = size(p, 1, 1 << 24);
  doc["cluster"] = {{"gpu", pick(p, kGpus)},
                    {"num_gpus", p.ConsumeBool() ? tp * pp * dp : size(p, 1, 1 << 24)},
                    {"gpus_per_node", size(p, 1, 1024)}};
  if (p.ConsumeBool()) {
    doc["cluster"]["runtime_reserve_bytes"] = p.ConsumeIntegralInRange<std::int64_t>(0, 1LL << 40);
  }
  static const char* const kDtypes[] = {"fp32", "fp16", "bf16"};
  static const char* const kOptimizers[] = {"adamw", "adam", "sgd"};
  doc["training"] = {{"seq_length", size(p, 1, 1 << 22)},
                     {"global_batch_size",
                      p.ConsumeBool() ? dp * mbs * size(p, 1, 1 << 12) : size(p, 1, 1LL << 32)},
                     {"micro_batch_size", mbs},
                     {"precision", pick(p, kDtypes)},
                     {"optimizer", pick(p, kOptimizers)},
                     {"grad_accumulation_dtype", pick(p, kDtypes)},
                     {"attention", p.ConsumeBool() ? "flash" : "standard"},
                     {"dropout", p.ConsumeFloatingPointInRange(0.0, 0.5)}};
  static const char* const kRecompute[] = {"none", "selective", "full"};
  static const char* const kSchedules[] = {"gpipe",      "1f1b",    "interleaved_1f1b", "zb_h1",
                                           "zb_h2",      "zb_v",    "v_half",           "v_min",
                                           "dualpipe_v", "zb_auto", "dualpipe"};
  const int zero = p.ConsumeIntegralInRange(0, 3);
  doc["parallel"] = {{"tp", tp},
                     {"pp", pp},
                     {"dp", dp},
                     {"zero_stage", zero},
                     {"fsdp_shard_size", p.ConsumeBool() ? dp : size(p, 1, dp)},
                     {"sequence_parallel", p.ConsumeBool()},
                     {"recompute", pick(p, kRecompute)},
                     {"schedule", pick(p, kSchedules)},
                     {"virtual_stages", size(p, 1, 1024)}};
  if (p.ConsumeBool()) {
    doc["assumptions"] = {{"compute_efficiency", p.ConsumeFloatingPointInRange(0.01, 1.0)},
                          {"communication_efficiency", p.ConsumeFloatingPointInRange(0.01, 1.0)},
                          {"zero3_prefetch_layers", p.ConsumeIntegralInRange(0, 64)},
                          {"overlap_grad_reduce", p.ConsumeBool()},
                          {"overlap_param_gather", p.ConsumeBool()},
                          {"vocab_pad_multiple", size(p, 1, 1 << 16)}};
  }
  if (p.ConsumeBool()) {
    doc["costs"] = {{"forward_seconds", p.ConsumeFloatingPointInRange(0.0, 10.0)},
                    {"backward_seconds", p.ConsumeFloatingPointInRange(0.0, 20.0)},
                    {"p2p_seconds", p.ConsumeFloatingPointInRange(0.0, 1.0)}};
    if (p.ConsumeBool()) {
      doc["costs"]["backward_weight_seconds"] = p.ConsumeFloatingPointInRange(0.0, 10.0);
    }
  }
  return doc;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider provider(data, size);
  const json doc = make_scenario(provider);
  // Triage: DISTPLAN_FUZZ_PRINT=1 ./layout_fuzz CRASH_FILE prints the scenario it builds.
  static const bool print = std::getenv("DISTPLAN_FUZZ_PRINT") != nullptr;
  if (print) std::fprintf(stderr, "%s\n", doc.dump().c_str());
  distplan::fuzz::run_pipeline(doc);
  return 0;
}
