"""What a sweep needs: plan_many keeping going past bad scenarios, scenario() building scenarios
from flat keywords, search plans carrying their whole scenario, and export() of any of them."""

import copy

import pytest

import distplan
from conftest import run_cli


def bad_tp(default):
    s = copy.deepcopy(default)
    s["parallel"]["tp"] = 3
    return s


def test_plan_many_returns_each_error_in_its_place(default):
    nan = copy.deepcopy(default)
    nan["training"]["micro_batch_size"] = float("nan")
    good = copy.deepcopy(default)
    good["training"]["micro_batch_size"] = 2
    scenarios = [default, bad_tp(default), good, nan] * 9  # spans more than one block of 16
    out = distplan.plan_many(scenarios, errors="return")
    assert len(out) == len(scenarios)
    # The oracle: plan() of each scenario alone, its answer or the error it raises.
    with pytest.raises(distplan.InputError) as tp_error:
        distplan.plan(bad_tp(default))
    with pytest.raises(distplan.InputError) as nan_error:
        distplan.plan(nan)
    for i in range(0, len(scenarios), 4):
        assert out[i] == distplan.plan(default)
        assert out[i + 2] == distplan.plan(good)
        for got, want in ((out[i + 1], tp_error.value), (out[i + 3], nan_error.value)):
            assert isinstance(got, distplan.InputError)
            # The path is inside the scenario: its place in the list is the index.
            assert (got.path, got.message, got.code) == (want.path, want.message, want.code)
    assert out[3].path == "/training/micro_batch_size"


def test_plan_many_raises_by_default_with_the_index(default):
    with pytest.raises(distplan.InputError) as info:
        distplan.plan_many([default, bad_tp(default)], parts=["time"])
    assert info.value.path.startswith("/1/parallel")
    with pytest.raises(ValueError, match="errors must be"):
        distplan.plan_many([default], errors="ignore")


def test_scenario_keywords_build_the_embedded_default():
    # data/scenarios/default.json, spelled as keywords: the same plan, figure for figure.
    s = distplan.scenario(
        "llama2-70b", gpu="h100-sxm-80gb", gpus=64, gpus_per_node=8, seq=4096, gbs=512, mbs=1,
        precision="bf16", optimizer="adamw", tp=8, pp=4, dp=2, zero=1, sp=True,
        recompute="selective", schedule="1f1b", vp=1,
    )
    assert distplan.plan(s)["memory"] == distplan.plan(distplan.default_scenario())["memory"]
    assert distplan.plan(s)["time"] == distplan.plan(distplan.default_scenario())["time"]


def test_scenario_overrides_a_base_without_changing_it(default):
    before = copy.deepcopy(default)
    s = distplan.scenario(default, tp=4)
    assert default == before
    # dp follows the GPU count when tp changes and dp is not given: 64 / (4 x 4).
    assert distplan.plan(s)["scenario"]["parallel"]["dp"] == 4
    # A plan's echo (every default filled in, fsdp_shard_size = dp) is a base as well.
    echo = distplan.plan(default)["scenario"]
    p = distplan.plan(distplan.scenario(echo, pp=8, zero=3))
    assert (p["scenario"]["parallel"]["dp"], p["scenario"]["parallel"]["fsdp_shard_size"]) == (1, 1)
    # Model fields override the preset's; None removes a field.
    half = distplan.scenario(default, num_layers=40, tp=8, pp=2)
    assert half["model"] == {"preset": "llama2-70b", "num_layers": 40}
    assert "dp" not in distplan.scenario(default, dp=None)["parallel"]
    assert distplan.scenario(default, parallel={"cp": 2, "tp": 4})["parallel"]["cp"] == 2


def test_scenario_refuses_unknown_keywords_at_once(default):
    with pytest.raises(distplan.InputError, match="no field 'tensor_parallel'"):
        distplan.scenario(default, tensor_parallel=8)
    with pytest.raises(distplan.InputError, match="given twice"):
        distplan.scenario(default, gpus=8, num_gpus=8)
    # Values are the library's to check, at their JSON path, when planned.
    with pytest.raises(distplan.InputError) as info:
        distplan.plan(distplan.scenario(default, zero=7))
    assert info.value.path == "/parallel/zero_stage"


def test_scenario_knows_every_field_the_library_echoes():
    # A scenario with the optional fields set, so the echo lists them all.
    s = distplan.scenario(
        "mixtral-8x7b", gpu="h100-sxm-80gb", gpus=32, seq=4096, gbs=256, tp=1, pp=4, dp=8, ep=8,
        framework="megatron", zero=1,
    )
    echo = distplan.plan(s)["scenario"]
    from distplan._scenario import FIELDS

    for section in ("training", "cluster", "parallel", "assumptions", "model"):
        for key in echo[section]:
            if (section, key) in {("model", "name"), ("model", "moe")}:
                continue
            assert FIELDS.get(key) == section, f"{section}.{key}"


def search_request(default):
    r = copy.deepcopy(default)
    del r["parallel"]
    r["parallel"] = {"tp": [4, 8], "pp": [2, 4]}
    r["search"] = {"top_k": 3}
    return r


def test_search_plans_carry_their_whole_scenario(default):
    result = distplan.search(search_request(default))
    assert result["plans"]
    for entry in result["plans"]:
        plan = distplan.plan(entry["scenario"])
        memory = plan["memory"]
        assert memory[memory["fits_compares"]] == entry["peak_bytes"]  # what fits compares
        assert plan["time"]["step_seconds"] == entry["step_seconds"]
        assert entry["scenario"]["parallel"] == entry["parallel"]


def test_export_is_the_clis_export(default):
    # Each framework's export of the best plan of a search under that framework (an export needs
    # a plan made under its framework).
    for to in ("megatron", "deepspeed", "torchtitan"):
        request = search_request(default)
        request["training"]["framework"] = to
        best = distplan.search(request)["plans"][0]
        ours = distplan.export(best, to)
        rc, out, err = run_cli(["export", "-", "--to", to], best["scenario"])
        assert rc == 0, err
        assert ours["text"] == out
        assert ours["fits"] is True
        # A plan document and a bare scenario export the same layout.
        assert distplan.export(distplan.plan(best["scenario"]), to)["text"] == out
        assert distplan.export(best["scenario"], to)["text"] == out


def test_export_refuses_what_does_not_fit_unless_forced(default):
    s = distplan.scenario(default, pp=1, zero=0, sp=False, recompute="none")
    rc, _, err = run_cli(["export", "-", "--to", "megatron"], s)
    assert rc == 2
    with pytest.raises(distplan.InputError) as info:
        distplan.export(s, "megatron")
    assert info.value.path == "/parallel"
    assert "does not fit" in info.value.message
    forced = distplan.export(s, "megatron", force=True)
    assert forced["fits"] is False and "does not fit" in forced["warning"]
    with pytest.raises(distplan.InputError, match="megatron, deepspeed or torchtitan"):
        distplan.export(default, "nemo")
