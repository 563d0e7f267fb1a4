#!/usr/bin/env bash
# Writes the seed corpus of scenario_fuzz into DIR: every scenario in data/scenarios, one scenario
# per model preset, and hand-made variants that reach each layout option, the custom model and GPU
# objects, hf_config, costs, and a few near-misses of the validation rules.
# Usage: fuzz/make_corpus.sh DIR
set -euo pipefail
out=${1:?usage: make_corpus.sh DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"

for f in "$root"/data/scenarios/*.json; do cp "$f" "$out/scenario-$(basename "$f")"; done

for f in "$root"/data/models/*.json; do
  name=$(basename "$f" .json)
  cat >"$out/model-$name.json" <<JSON
{"model": "$name", "cluster": {"gpu": "a100-80gb", "num_gpus": 8},
 "training": {"seq_length": 2048, "global_batch_size": 64},
 "parallel": {"tp": 1, "pp": 1, "zero_stage": 3}}
JSON
done

v() { cat >"$out/variant-$1.json"; }
v interleaved <<'JSON'
{"model": "gpt3-13b", "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 32, "gpus_per_node": 8},
 "training": {"seq_length": 2048, "global_batch_size": 256, "micro_batch_size": 2, "precision": "bf16",
              "optimizer": "adam", "attention": "standard", "dropout": 0.1},
 "parallel": {"tp": 4, "pp": 4, "dp": 2, "zero_stage": 1, "sequence_parallel": true,
              "recompute": "full", "schedule": "interleaved_1f1b", "virtual_stages": 5}}
JSON
v custom <<'JSON'
{"model": {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "num_kv_heads": 2,
           "ffn_hidden_size": 1024, "vocab_size": 1000, "mlp": "swiglu", "norm": "rmsnorm",
           "position_embedding": "rotary", "tied_embeddings": true, "bias": false},
 "cluster": {"gpu": {"memory_bytes": 17179869184, "peak_flops": {"fp32": 1e13, "bf16": 1e14},
                     "memory_bandwidth": 1e12, "intra_node_bandwidth": 1e11,
                     "inter_node_bandwidth": 1e10, "gpus_per_node": 4},
             "num_gpus": 8, "runtime_reserve_bytes": 0, "intra_node_latency": 0},
 "training": {"seq_length": 128, "global_batch_size": 16, "micro_batch_size": 1,
              "precision": "fp32", "optimizer": "sgd", "grad_accumulation_dtype": "fp32"},
 "parallel": {"tp": 2, "pp": 2, "zero_stage": 2, "fsdp_shard_size": 1, "schedule": "zb_h1"},
 "assumptions": {"compute_efficiency": 0.4, "communication_efficiency": 0.7,
                 "zero3_prefetch_layers": 2, "overlap_grad_reduce": false,
                 "overlap_param_gather": false, "vocab_pad_multiple": 128}}
JSON
v preset-override <<'JSON'
{"model": {"preset": "llama2-7b", "num_layers": 8},
 "cluster": {"gpu": {"preset": "a100-40gb", "memory_bytes": 42949672960}, "num_gpus": 16},
 "training": {"seq_length": 4096, "global_batch_size": 32, "precision": "fp16"},
 "parallel": {"tp": 2, "pp": 4, "dp": 2, "zero_stage": 3, "fsdp_shard_size": 2,
              "schedule": "gpipe", "layers_per_stage": [1, 3, 3, 1]}}
JSON
v hf-llama <<'JSON'
{"model": {"hf_config": {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 512,
           "num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 1376,
           "vocab_size": 32000, "max_position_embeddings": 4096, "hidden_act": "silu",
           "tie_word_embeddings": false}},
 "cluster": {"gpu": "l40s-48gb", "num_gpus": 2},
 "training": {"seq_length": 512, "global_batch_size": 8}, "parallel": {"tp": 2}}
JSON
v hf-gpt2 <<'JSON'
{"model": {"hf_config": {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
           "vocab_size": 50257, "n_positions": 1024}},
 "cluster": {"gpu": "mi300x-192gb", "num_gpus": 1},
 "training": {"seq_length": 1024, "global_batch_size": 4}}
JSON
v costs <<'JSON'
{"model": "tiny-gpt", "cluster": {"gpu": "a100-80gb", "num_gpus": 4},
 "training": {"seq_length": 256, "global_batch_size": 16},
 "parallel": {"pp": 4, "schedule": "zb_h2"},
 "costs": {"forward_seconds": 1.0, "backward_seconds": 1.0, "backward_weight_seconds": 1.0,
           "p2p_seconds": 0.1}}
JSON
v huge <<'JSON'
{"model": {"num_layers": 1000, "hidden_size": 32768, "num_attention_heads": 256,
           "ffn_hidden_size": 131072, "vocab_size": 256000},
 "cluster": {"gpu": "b200-192gb", "num_gpus": 16777216},
 "training": {"seq_length": 8192, "global_batch_size": 16777216},
 "parallel": {"tp": 256, "pp": 1000, "zero_stage": 3}}
JSON
v bad-tp <<'JSON'
{"model": "llama2-70b", "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 24},
 "training": {"seq_length": 4096, "global_batch_size": 512}, "parallel": {"tp": 3, "pp": 8}}
JSON
v bad-types <<'JSON'
{"model": "llama2-70b", "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": "64"},
 "training": {"seq_length": 4096.5, "global_batch_size": -1, "dropout": 1e999},
 "parallel": {"tp": null, "sequence_paralel": true}}
JSON
printf '' >"$out/empty.json"
printf '[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]' >"$out/nested.json"
printf '{"model": "\xff\xfe\xc3\x28"}' >"$out/non-utf8.json"
echo "$(ls "$out" | wc -l) seeds in $out"
