"""The module answers exactly what the CLI answers for the same document: it calls the same library
functions and serialisers, so any difference is a bug in the binding (conversion, defaults)."""

import copy
import glob
import json
import os
import re

import pytest

import distplan
from conftest import cli_error, cli_json, run_cli

# Scenarios covering presets, object models, every schedule, ZeRO stages and recompute modes.
VARIANTS = [
    {},
    {"parallel": {"tp": 8, "pp": 8, "dp": 1, "zero_stage": 0, "schedule": "gpipe"}},
    {"parallel": {"tp": 4, "pp": 4, "dp": 4, "zero_stage": 3, "schedule": "zb_h1",
                  "recompute": "full"}},
    {"parallel": {"tp": 8, "pp": 4, "dp": 2, "schedule": "interleaved_1f1b",
                  "virtual_stages": 2, "recompute": "none"}},
    {"training": {"framework": "generic", "seq_length": 8192, "global_batch_size": 256, "micro_batch_size": 2,
                  "precision": "bf16", "optimizer": "adamw", "attention": "standard"}},
    {"model": {"preset": "llama2-70b", "num_layers": 40}},
    {"model": "mistral-7b", "parallel": {"tp": 2, "pp": 1, "dp": 32, "zero_stage": 2}},
]


def python_floats(text):
    return re.sub(r"(?<=: )-?\d(?:\.\d+)?e\+15(?=[,\n])", lambda m: repr(float(m.group(0))), text)


def scenario_with(default, change):
    s = copy.deepcopy(default)
    # Every schedule distplan models: the textbook framework runs them all (docs/frameworks.md).
    s["training"]["framework"] = "generic"
    for key, value in change.items():
        s[key] = value
    return s


@pytest.mark.parametrize("change", VARIANTS)
def test_plan_is_the_clis_document_byte_for_byte(default, change):
    s = scenario_with(default, change)
    rc, out, err = run_cli(["plan", "-"], s)
    assert rc == 0, err
    ours = distplan.plan(s)
    assert ours == json.loads(out)
    # Same text as well: nlohmann's and Python's shortest round-trip float formats agree, but for
    # doubles in [1e15, 1e16) (FP8 peaks), which nlohmann writes with an exponent (its fixed
    # notation stops at 15 digits) and Python's repr without: those are compared as Python
    # writes them.
    assert json.dumps(ours, indent=2) + "\n" == python_floats(out)


def test_embedded_scenarios_plan_as_in_the_cli(source_dir):
    files = sorted(glob.glob(os.path.join(source_dir, "data", "scenarios", "*.json")))
    files += sorted(glob.glob(os.path.join(source_dir, "data", "validation", "*-*.json")))
    files = [f for f in files if not f.endswith(".result.json")]
    assert files
    for path in files:
        with open(path) as f:
            doc = json.load(f)
        assert distplan.plan(doc) == cli_json(["plan", path]), path


def test_default_scenario_is_the_clis_default():
    assert distplan.plan(distplan.default_scenario()) == cli_json(["plan"])


def test_simulate_matches_the_cli_with_and_without_costs(default):
    assert distplan.simulate(default) == cli_json(["simulate", "-"], default)
    costs = {"forward_seconds": 1.0, "backward_seconds": 2.0, "p2p_seconds": 0.0}
    with_costs = dict(default, costs=costs)
    expected = cli_json(["simulate", "-"], with_costs)
    assert distplan.simulate(default, costs=costs) == expected
    assert distplan.simulate(with_costs) == expected


def test_costs_given_twice_are_an_error_at_costs(default):
    costs = {"forward_seconds": 1.0, "backward_seconds": 2.0}
    with pytest.raises(distplan.InputError) as info:
        distplan.simulate(dict(default, costs=costs), costs=costs)
    assert info.value.path == "/costs"
    # A bad costs= argument is reported where the CLI reports the scenario's "costs" member.
    bad = {"forward_seconds": -1.0, "backward_seconds": 2.0}
    expected = cli_error(["simulate", "-"], dict(default, costs=bad))
    with pytest.raises(distplan.InputError) as info:
        distplan.simulate(default, costs=bad)
    assert (info.value.path, info.value.message) == (expected["path"], expected["message"])


def test_presets_match_the_cli():
    assert distplan.presets() == cli_json(["presets", "--format", "json"])


# Wall-clock figures differ between two runs of the same search, and so does `pruned` with more
# than one thread (docs/search.md: which layouts the shared bound skips depends on scheduling);
# everything else must not.
TIMING_KEYS = {"seconds", "evaluate_seconds", "layouts_per_second", "threads", "pruned"}


def without_timing(doc):
    return {k: v for k, v in doc.items() if k not in TIMING_KEYS}


@pytest.mark.parametrize("threads", [1, 2])
def test_search_results_equal_the_clis(threads):
    request = {
        "model": "gpt3-1.3b",
        "cluster": {"gpu": "a100-80gb", "num_gpus": 16, "gpus_per_node": 8},
        "training": {"framework": "generic", "seq_length": 2048, "global_batch_size": 64, "precision": "bf16",
                     "optimizer": "adamw"},
        "search": {"top_k": 8, "threads": threads},
    }
    ours = distplan.search(request)
    theirs = cli_json(["search", "-", "--quiet"], request)
    assert without_timing(ours) == without_timing(theirs)
    assert len(ours["plans"]) == 8
    assert ours["evaluated"] > 1000


def test_search_with_candidate_lists_matches_the_cli(default):
    request = copy.deepcopy(default)
    request["parallel"] = {"tp": [4, 8], "pp": [2, 4, 8], "zero_stage": [1, 3]}
    request["training"]["micro_batch_size"] = [1, 2]
    request["search"] = {"top_k": 4, "threads": 1}
    ours = distplan.search(request)
    theirs = cli_json(["search", "-", "--quiet"], request)
    # One thread: the search is the same computation twice, `pruned` included.
    assert ours["pruned"] == theirs["pruned"]
    assert without_timing(ours) == without_timing(theirs)


def test_validate_returns_the_clis_result():
    scenario = {
        "model": "tiny-gpt",
        "cluster": {"gpu": "a100-80gb", "num_gpus": 1},
        "training": {"framework": "generic", "seq_length": 32, "global_batch_size": 4, "micro_batch_size": 2,
                     "precision": "fp32"},
        "parallel": {"tp": 1, "pp": 1, "dp": 1},
    }
    ours = distplan.validate(scenario, device="cpu", steps=2)
    theirs = cli_json(["validate", "-", "--steps", "2"], scenario)
    assert ours["schema"] == "distplan.validate/v1"
    # Predicted memory and communication are deterministic; times are not (the prediction's
    # step time uses costs measured in that run).
    for part in ("memory", "communication"):
        assert ours["predicted"][part] == theirs["predicted"][part]
    assert ours["measured"]["memory"] == theirs["measured"]["memory"]
    assert len(ours["losses"]) == 2


@pytest.mark.parametrize(
    "change, path",
    [
        ({"parallel": {"tp": 3, "pp": 4, "dp": 2}}, None),
        ({"training": {"framework": "generic", "seq_length": 4096, "global_batch_size": 512, "micro_batchsize": 1}},
         "/training/micro_batchsize"),
        ({"model": "llama-9000"}, "/model"),
        ({"cluster": {"gpu": "h100-sxm-80gb", "num_gpus": -8}}, "/cluster/num_gpus"),
        ({"parallel": {"tp": 8, "pp": 4, "dp": 2, "schedule": "wavy"}}, "/parallel/schedule"),
        ({"extra": 1}, "/extra"),
    ],
)
def test_errors_carry_the_clis_path_code_and_message(default, change, path):
    s = scenario_with(default, change)
    expected = cli_error(["plan", "-"], s)
    if path is not None:
        assert expected["path"] == path
    for call in (distplan.plan, distplan.simulate, lambda d: distplan.plan_many([d])):
        with pytest.raises(distplan.InputError) as info:
            call(s)
        err = info.value
        offset = "/0" if call not in (distplan.plan, distplan.simulate) else ""
        assert err.path == offset + expected["path"]
        assert err.code == expected["code"] == "invalid_input"
        assert err.message == expected["message"]
    with pytest.raises(distplan.InputError) as info:
        distplan.validate(s)
    assert (info.value.path, info.value.code, info.value.message) == (
        expected["path"], expected["code"], expected["message"])


def test_search_errors_carry_the_clis_path(default):
    request = dict(default, search={"top_k": 0})
    expected = cli_error(["search", "-", "--quiet"], request)
    with pytest.raises(distplan.InputError) as info:
        distplan.search(request)
    assert (info.value.path, info.value.message) == (expected["path"], expected["message"])


def _runs_document(default):
    """Runs whose measured times are the plan's at other assumptions, so the fit has an answer."""
    runs = []
    layouts = [{"tp": 8, "pp": 4, "dp": 2}, {"tp": 4, "pp": 4, "dp": 4}, {"tp": 8, "pp": 8, "dp": 1},
               {"tp": 2, "pp": 8, "dp": 4}]
    for i, layout in enumerate(layouts):
        s = copy.deepcopy(default)
        s["parallel"].update(layout)
        truth = copy.deepcopy(s)
        truth.setdefault("assumptions", {}).update(
            {"compute_efficiency": 0.43, "communication_efficiency": 0.67})
        step = distplan.plan(truth)["time"]["step_seconds"]
        runs.append({"name": f"run{i}", "scenario": s, "measured": {"step_seconds": step}})
    return {"runs": runs}


def test_calibrate_is_the_clis_document(default):
    doc = _runs_document(default)
    ours = distplan.calibrate(doc)
    assert ours == cli_json(["calibrate", "-"], doc)
    assert ours["schema"] == "distplan.calibration/v1"
    # A list of runs is the same document.
    assert distplan.calibrate(doc["runs"]) == ours


def test_calibrate_errors_name_the_run(default):
    doc = _runs_document(default)
    doc["runs"][1]["measured"]["step_seconds"] = -1.0
    with pytest.raises(distplan.InputError) as e:
        distplan.calibrate(doc)
    assert e.value.path == "/runs/1/measured/step_seconds"
    assert e.value.path == cli_error(["calibrate", "-"], doc)["path"]
