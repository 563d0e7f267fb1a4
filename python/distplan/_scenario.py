"""scenario(): a scenario dict from a preset name (or a base scenario) and flat keyword overrides,
for sweeps without nested dicts and deep copies (docs/python.md, "Building scenarios").

The helper only places values: every value is checked by the library when the scenario is
planned, and a bad one raises InputError at its JSON path there, exactly as from a file."""

from __future__ import annotations

import copy
from typing import Any, Dict, Mapping, Optional, Union

from ._errors import InputError

# Where each flat keyword goes: the scenario's own field names (docs/scenario.md), section by
# section. Names are unique across these sections; the GPU object and a framework profile's
# overrides are given whole (gpu={...}, framework_profile={...}). tests/python/test_sweeps.py
# holds this table against every field the library echoes.
_SECTIONS = {
    "model": (
        "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size",
        "vocab_size", "mlp", "norm", "position_embedding", "max_position_embeddings",
        "tied_embeddings", "bias", "qkv_bias", "rope_theta", "rope_scaling_factor",
        "embedding_norm",
    ),
    "training": (
        "seq_length", "global_batch_size", "micro_batch_size", "precision", "fp8_recipe",
        "optimizer", "framework", "grad_accumulation_dtype", "attention", "dropout", "kernels",
        "cuda_graphs", "optimizer_state_dtype", "peft",
    ),
    "cluster": (
        "gpu", "num_gpus", "gpus_per_node", "intra_node_bandwidth", "inter_node_bandwidth",
        "intra_node_latency", "inter_node_latency", "runtime_reserve_bytes", "host_memory_bytes",
        "nvme_bandwidth", "nvlink_domain_size", "power_limit_watts",
    ),
    "parallel": (
        "tp", "pp", "dp", "cp", "cp_comm", "ep", "etp", "zero_stage", "fsdp_shard_size",
        "sequence_parallel", "recompute", "schedule", "virtual_stages", "offload_optimizer",
        "offload_params", "layers_per_stage", "layers_per_virtual_stage", "pipeline_split",
        "zb_memory_limit_microbatches",
    ),
    "assumptions": (
        "compute_efficiency", "memory_efficiency", "communication_efficiency",
        "nccl_half_bandwidth_bytes", "kernel_launch_seconds", "overlap_compute_slowdown",
        "tp_comm_overlap", "overlap_p2p", "p2p_scatter_gather", "overlap_param_gather_after_step",
        "tree_all_reduce", "zero3_prefetch_layers", "overlap_grad_reduce", "overlap_param_gather",
        "vocab_pad_multiple", "moe_load_imbalance", "pcie_efficiency", "cpu_optimizer_bandwidth",
        "nvme_optimizer_buffer_count", "nvme_sub_group_params", "nvme_param_buffer_count",
        "nvme_param_buffer_params", "fp8_amax_history_len", "framework_profile",
        "clock_power_exponent", "fp8_compute_efficiency", "grouped_gemm_efficiency",
    ),
}

# The short names people type (Megatron-LM's and llm-analysis' habits) for the long fields.
ALIASES = {
    "gpus": "num_gpus",
    "seq": "seq_length",
    "gbs": "global_batch_size",
    "mbs": "micro_batch_size",
    "zero": "zero_stage",
    "sp": "sequence_parallel",
    "vp": "virtual_stages",
}

FIELDS: Dict[str, str] = {name: section for section, names in _SECTIONS.items() for name in names}

# Whole sections given as dicts, merged over the base's (scenario(..., parallel={...})).
_SECTION_ARGS = ("model", "training", "cluster", "parallel", "assumptions")


def scenario(
    base: Union[str, Mapping[str, Any], None] = None,
    **overrides: Any,
) -> Dict[str, Any]:
    """A scenario dict for plan(), plan_many(), simulate(), search() and export().

    ``base`` is a model preset name ("llama3.1-70b"), a model dict, or a whole scenario dict
    (a plan's ``"scenario"`` or a search plan's ``"scenario"`` too), copied, never changed.
    Keywords set one field each, by its name in the scenario (docs/scenario.md) or a short alias
    (gpus, seq, gbs, mbs, zero, sp, vp): ``scenario("llama3.1-70b", gpu="h100-sxm-80gb",
    gpus=64, seq=8192, gbs=512, tp=8, pp=4)``. Model fields (num_layers=40, ...) override the
    preset's. A keyword named after a section (parallel={...}, assumptions={...}) merges a dict
    into it. None removes a field.

    When tp, pp, cp or the GPU count changes and dp is not given, dp is left for the library to
    derive (num_gpus / (tp·cp·pp)), and so is a ZeRO shard group that spanned the old dp; a new
    pp drops an explicit layers_per_stage. An unknown keyword raises InputError at once."""
    if base is None:
        doc: Dict[str, Any] = {}
    elif isinstance(base, str):
        doc = {"model": base}
    elif isinstance(base, Mapping):
        looks_like_scenario = any(k in base for k in ("model", "training", "cluster", "parallel"))
        doc = copy.deepcopy(dict(base))
        if not looks_like_scenario:
            doc = {"model": doc}
    else:
        raise TypeError(
            f"scenario() takes a preset name, a model dict or a scenario dict, not {type(base).__name__}"
        )

    fields: Dict[str, Any] = {}
    sections: Dict[str, Mapping[str, Any]] = {}
    for key, value in overrides.items():
        if key in _SECTION_ARGS:
            if not isinstance(value, Mapping):
                raise InputError(f"{key}= takes a dict of the {key} section's fields", "/" + key)
            sections[key] = value
            continue
        name = ALIASES.get(key, key)
        if name not in FIELDS:
            raise InputError(
                f"scenario() has no field '{key}' (fields are the scenario's names, docs/scenario.md; "
                f"aliases: {', '.join(sorted(ALIASES))})",
                "",
            )
        if name in fields:
            raise InputError(f"'{name}' is given twice (as '{key}' and by its other name)", "")
        fields[name] = value

    _drop_derived(doc, fields, sections)
    for section, values in sections.items():
        _merge(doc, section, values)
    for name, value in fields.items():
        _set(doc, FIELDS[name], name, value)
    return doc


def _section(doc: Dict[str, Any], section: str) -> Dict[str, Any]:
    if section == "model":
        model = doc.get("model")
        if isinstance(model, str):
            model = {"preset": model}
        elif model is None:
            model = {}
        doc["model"] = model
        return model
    current = doc.get(section)
    if current is None:
        current = doc[section] = {}
    if not isinstance(current, dict):
        raise InputError(f"{section} must be an object to set its fields", "/" + section)
    return current


def _set(doc: Dict[str, Any], section: str, name: str, value: Any) -> None:
    target = _section(doc, section)
    if value is None:
        target.pop(name, None)
    else:
        target[name] = copy.deepcopy(value)


def _merge(doc: Dict[str, Any], section: str, values: Mapping[str, Any]) -> None:
    for name, value in values.items():
        _set(doc, section, name, value)


def _drop_derived(
    doc: Dict[str, Any], fields: Dict[str, Any], sections: Dict[str, Mapping[str, Any]]
) -> None:
    """Leaves dp (and what follows it) to the library when the layout's other factors change."""
    given = set(fields) | {k for v in sections.values() for k in v}
    parallel = doc.get("parallel")
    if not isinstance(parallel, dict):
        return
    changes_gpus = any(k in given for k in ("tp", "pp", "cp", "num_gpus"))
    if changes_gpus and "dp" not in given and "dp" in parallel:
        old_dp = parallel.pop("dp")
        if "fsdp_shard_size" not in given and parallel.get("fsdp_shard_size") == old_dp:
            parallel.pop("fsdp_shard_size")
    if "pp" in given and "layers_per_stage" not in given:
        parallel.pop("layers_per_stage", None)
