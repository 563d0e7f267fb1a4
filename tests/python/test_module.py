"""What only the Python side has: values JSON cannot hold, plan_many over a long sweep, the GIL
released during long calls, the version and the type stubs."""

import ast
import copy
import os
import re
import threading
import time

import pytest

import distplan
from conftest import SOURCE_DIR


@pytest.mark.parametrize(
    "value, path, reason",
    [
        ({1, 2}, "/training/micro_batch_size", "is not JSON"),
        (float("nan"), "/training/micro_batch_size", "NaN"),
        (2**70, "/training/micro_batch_size", "64-bit"),
        ({3: 1}, "/training/micro_batch_size", "keys must be strings"),
        ([1, object()], "/training/micro_batch_size/1", "is not JSON"),
    ],
)
def test_python_values_json_cannot_hold_are_input_errors(default, value, path, reason):
    default["training"]["micro_batch_size"] = value
    with pytest.raises(distplan.InputError) as info:
        distplan.plan(default)
    assert info.value.path == path
    assert reason in info.value.message
    assert info.value.code == "invalid_input"
    assert isinstance(info.value, ValueError)


def test_pointer_tokens_are_escaped(default):
    default["parallel"]["a/b~c"] = 1
    with pytest.raises(distplan.InputError) as info:
        distplan.plan(default)
    assert info.value.path == "/parallel/a~1b~0c"


def test_tuples_read_as_arrays(default):
    default["model"] = {"preset": "llama2-70b"}
    assert distplan.plan(default)["memory"] == distplan.plan(distplan.default_scenario())["memory"]


def sweep(default, n):
    """n scenarios over micro-batch sizes, ZeRO stages and recompute modes."""
    out = []
    for i in range(n):
        s = copy.deepcopy(default)
        s["training"]["micro_batch_size"] = (1, 2, 4, 8)[i % 4]
        s["parallel"]["zero_stage"] = (0, 1, 2, 3)[(i // 4) % 4]
        s["parallel"]["recompute"] = ("none", "selective", "full")[(i // 16) % 3]
        s["training"]["seq_length"] = 1024 * (1 + (i // 48) % 8)
        out.append(s)
    return out


def test_plan_many_on_ten_thousand_scenarios(default):
    scenarios = sweep(default, 10_000)
    plans = distplan.plan_many(scenarios)
    assert len(plans) == 10_000
    # In order: each answer echoes its own scenario, and equals plan() of it.
    for i in range(0, 10_000, 97):
        assert plans[i] == distplan.plan(scenarios[i])
    for s, p in zip(scenarios, plans):
        assert p["scenario"]["training"]["micro_batch_size"] == s["training"]["micro_batch_size"]
        assert p["scenario"]["parallel"]["zero_stage"] == s["parallel"]["zero_stage"]
        assert p["memory"]["peak_bytes"] == max(st["total_bytes"] for st in p["memory"]["stages"])
    # Independent of the planner: ZeRO never raises memory, at equal everything else.
    by_key = {}
    for s, p in zip(scenarios, plans):
        key = (s["training"]["micro_batch_size"], s["parallel"]["recompute"],
               s["training"]["seq_length"])
        by_key.setdefault(key, {})[s["parallel"]["zero_stage"]] = p["memory"]["peak_bytes"]
    for peaks in by_key.values():
        assert peaks[0] >= peaks[1] >= peaks[2] >= peaks[3]


def test_plan_many_names_the_failing_scenario_by_index(default):
    scenarios = sweep(default, 600)
    scenarios[517]["parallel"]["tp"] = 3
    with pytest.raises(distplan.InputError) as info:
        distplan.plan_many(scenarios)
    assert info.value.path.startswith("/517/parallel")
    with pytest.raises(distplan.InputError) as info:
        distplan.plan_many([default, {"model": "gpt3-1.3b", "parallel": {"tp": {}}}])
    assert info.value.path.startswith("/1/")
    assert distplan.plan_many([]) == []
    with pytest.raises(TypeError):
        distplan.plan_many(42)


def test_the_gil_is_released_during_search(default):
    request = copy.deepcopy(default)
    del request["parallel"]
    del request["training"]["micro_batch_size"]
    request["search"] = {"top_k": 3, "threads": 1}
    done = threading.Event()
    result = {}

    def worker():
        start = time.perf_counter()
        result["doc"] = distplan.search(request)
        result["seconds"] = time.perf_counter() - start
        done.set()

    thread = threading.Thread(target=worker)
    ticks = 0
    thread.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    thread.join()
    # Python code ran all along the search (it takes a few hundred ms): ~one tick per ms.
    assert result["doc"]["evaluated"] > 10_000
    assert ticks >= 0.25 * result["seconds"] / 0.001


def test_version_is_the_projects():
    with open(os.path.join(SOURCE_DIR, "CMakeLists.txt")) as f:
        version = re.search(r"project\(distplan VERSION ([0-9.]+)", f.read()).group(1)
    assert distplan.__version__ == version


def test_stubs_name_exactly_the_compiled_functions():
    from distplan import _distplan

    stub = os.path.join(os.path.dirname(distplan.__file__), "_distplan.pyi")
    with open(stub) as f:
        tree = ast.parse(f.read())
    stubbed = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    compiled = {n for n in dir(_distplan) if not n.startswith("_")}
    assert stubbed == compiled
    assert os.path.exists(os.path.join(os.path.dirname(distplan.__file__), "py.typed"))


def test_plan_many_parts_are_those_members_of_the_full_document(default):
    scenarios = sweep(default, 40)
    full = distplan.plan_many(scenarios)
    for parts in (["memory", "time"], ["time"], ["schema", "scenario", "stage_costs"]):
        some = distplan.plan_many(scenarios, parts)
        assert [{k: p[k] for k in parts} for p in full] == some
    with pytest.raises(ValueError, match="unknown plan part 'memroy'"):
        distplan.plan_many(scenarios, ["memroy"])
    with pytest.raises(TypeError):
        distplan.plan_many(scenarios, "memory")


def test_threads_plan_at_once_and_agree_with_one_thread(default):
    scenarios = sweep(default, 400)
    expected = distplan.plan_many(scenarios, ["memory", "time"])
    results = [None] * 4

    def worker(k):
        results[k] = distplan.plan_many(scenarios, ["memory", "time"])

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r == expected for r in results)


# Per framework, a layout it runs (docs/frameworks.md) and the ZeRO stages it has with it.
LAYOUT_RUN_BY = {
    "generic": ({}, (0, 1, 3)),
    "megatron": ({}, (0, 1, 3)),
    # DeepSpeed's pipeline engine: ZeRO 0/1 beside it, tensor parallelism from the model code
    # (Megatron-DeepSpeed), no sequence parallelism.
    "deepspeed": ({"tp": 8, "pp": 2, "dp": 4, "sequence_parallel": False, "recompute": "none"},
                  (0, 1)),
    # torchtitan: FSDP2 (ZeRO-3) beside tp and pp, no Megatron-style selective recompute.
    "fsdp2": ({"recompute": "none"}, (3,)),
}


@pytest.mark.parametrize("framework", ["generic", "megatron", "deepspeed", "fsdp2"])
def test_fits_is_judged_on_the_peak_it_names(default, framework):
    """`fits` and the figure it compares agree (issue 24): the memory section names the figure,
    and a sweep over micro-batch sizes and ZeRO stages crosses the capacity both ways."""
    seen = set()
    layout, zeros = LAYOUT_RUN_BY[framework]
    for mbs in (1, 2, 4, 8, 16):
        for zero in zeros:
            s = copy.deepcopy(default)
            s["parallel"].update(layout)
            s["training"]["framework"] = framework
            s["training"]["micro_batch_size"] = mbs
            s["parallel"]["zero_stage"] = zero
            memory = distplan.plan(s)["memory"]
            judged = memory[memory["fits_compares"]]
            assert judged == max(st["reserved_bytes"] for st in memory["stages"])
            assert memory["fits"] == (judged <= memory["capacity_bytes"])
            seen.add(memory["fits"])
    assert seen == {True, False}


def test_documents_nested_without_end_are_refused_at_their_container(default):
    """A dict that contains itself, and a list nested 100,000 deep, crashed the interpreter
    (issue 29, item 11): both are refused at the container past 64 levels."""
    s = copy.deepcopy(default)
    s["model"] = {"preset": "llama2-7b"}
    s["model"]["self"] = s["model"]
    with pytest.raises(distplan.InputError) as info:
        distplan.plan(s)
    assert info.value.path == "/model" + "/self" * 63
    assert "nested deeper than 64 levels" in str(info.value)
    deep = []
    for _ in range(100_000):
        deep = [deep]
    s = copy.deepcopy(default)
    s["extra"] = deep
    with pytest.raises(distplan.InputError) as info:
        distplan.plan(s)
    assert info.value.path == "/extra" + "/0" * 63


def expect_ctrl_c_stops(call, delay):
    """Times `call()` whole, then again with a SIGINT `delay` s in: the interrupt must raise from
    the call, and (when the call takes over a second) in under half its time."""
    import signal

    class Interrupted(Exception):
        pass

    def handler(signum, frame):
        raise Interrupted()

    start = time.perf_counter()
    call()
    whole = time.perf_counter() - start
    previous = signal.signal(signal.SIGINT, handler)
    try:
        timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
        start = time.perf_counter()
        timer.start()
        with pytest.raises(Interrupted):
            call()
            time.sleep(10)  # the signal came after the call: it lands here instead
        stopped = time.perf_counter() - start
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    if whole > 1.0:
        assert stopped < 0.5 * whole, (stopped, whole)
    return whole


def test_ctrl_c_stops_a_long_search():
    """Ctrl-C inside distplan.search was not honoured (issue 29, item 13): the search ran on with
    the interpreter released. A SIGINT now raises from the call well before the search ends."""
    request = {
        "model": "llama3.1-405b",
        "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16384},
        "training": {"seq_length": 8192, "global_batch_size": 2048, "framework": "generic"},
        "parallel": {"schedule": ["1f1b", "interleaved_1f1b", "zb_h1", "zb_h2", "zb_v",
                                  "v_half", "dualpipe_v", "zb_auto"]},
        "search": {"threads": 1},
    }
    expect_ctrl_c_stops(lambda: distplan.search(request), 0.05)


def test_ctrl_c_stops_a_long_simulation():
    """Ctrl-C inside distplan.simulate was not honoured (issue 29, item 13). A 64-stage 1F1B step
    of 2^22 passes simulates for about 2 s; a SIGINT 0.1 s in raises from the call within a
    fraction of that (the walk looks at its cancel flag every 65,536 events)."""
    scenario = {
        "model": {"num_layers": 64, "hidden_size": 64, "num_attention_heads": 4,
                  "ffn_hidden_size": 256, "vocab_size": 512, "max_position_embeddings": 32},
        "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
        "training": {"seq_length": 32, "global_batch_size": 65536, "micro_batch_size": 1},
        "parallel": {"tp": 1, "pp": 64, "dp": 1, "schedule": "1f1b"},
        "costs": {"forward_seconds": 1e-3, "backward_seconds": 2e-3, "p2p_seconds": 1e-4},
    }
    expect_ctrl_c_stops(lambda: distplan.simulate(scenario), 0.1)


def test_plan_many_bounds_its_answer_before_building_it(default):
    # A million whole plan documents would be about 30 GB of Python objects: refused at once,
    # naming the size and parts=, with nothing planned past the first block.
    many = [default] * 1_000_000
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"1000000 plans would take about \d+\.\d GiB.*parts="):
        distplan.plan_many(many)
    assert time.perf_counter() - t0 < 5
    # The same bound holds what a small list of whole documents needs (about 30 KB each, measured
    # with tracemalloc: the estimate is within a factor of 1.5 of it).
    import tracemalloc  # noqa: PLC0415 (only this test needs it)
    tracemalloc.start()
    plans = distplan.plan_many([default] * 200)
    used = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(plans) == 200
    with pytest.raises(ValueError):
        distplan.plan_many([default] * 200, max_result_gib=used * 0.6 / 2**30)
    assert len(distplan.plan_many([default] * 200, max_result_gib=used * 1.5 / 2**30)) == 200
    # parts= shrinks the answer, and the bound with it.
    assert len(distplan.plan_many(many[:2000], parts=["time"], max_result_gib=0.01)) == 2000
    with pytest.raises(ValueError, match="max_result_gib"):
        distplan.plan_many([default], max_result_gib=0)
