"""export(): a plan's layout as a framework's launch settings (docs/exports.md), through the
library's exporter, as `distplan export --to FORMAT` prints it."""

from __future__ import annotations

from typing import Any, Dict, Mapping

from . import _distplan


def export(plan: Mapping[str, Any], to: str, force: bool = False) -> Dict[str, Any]:
    """The layout of ``plan`` as ``to`` = "megatron" | "deepspeed" | "torchtitan" settings.

    ``plan`` is a plan document (plan()'s answer), a search plan (an entry of search()'s
    "plans"), or a scenario dict. Returns {"to", "text", "notes", "to_add", "fits",
    "peak_bytes", "capacity_bytes"} ("warning" too when forced): ``text`` is what the CLI prints
    on stdout, ``notes`` where the framework cannot express the layout exactly, ``to_add`` what
    you still supply (tokenizer, data, learning-rate schedule, ...). A layout that does not fit
    raises InputError at /parallel unless ``force``; one the framework cannot run raises
    InputError at the field it cannot express."""
    scenario = plan
    if isinstance(plan, Mapping) and "scenario" in plan and "model" not in plan:
        scenario = plan["scenario"]
    return _distplan._export(scenario, to, force)
