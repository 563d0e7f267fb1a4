"""The examples of docs/python.md run as written and print what the page says."""

import contextlib
import io
import os
import re

from conftest import SOURCE_DIR


def python_blocks():
    with open(os.path.join(SOURCE_DIR, "docs", "python.md")) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def run_block(code, cwd):
    out = io.StringIO()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, "docs/python.md", "exec"), {"__name__": "docs_example"})
    finally:
        os.chdir(old)
    return out.getvalue()


def test_error_example_prints_what_its_comment_says(tmp_path):
    block = next(b for b in python_blocks() if "InputError" in b)
    expected = re.search(r"^# (/.*)$", block, re.M).group(1)
    assert run_block("import distplan\n" + block, tmp_path).strip() == expected


def test_sweep_example_runs(tmp_path):
    block = next(b for b in python_blocks() if "plan_many" in b)
    out = run_block(block, tmp_path)
    rows = [line.split() for line in out.splitlines()[1:5]]
    assert [int(r[0]) for r in rows] == [1, 2, 4, 8]
    # Larger micro-batches hold more activations: stage 0's memory grows with the size.
    stage0 = [float(r[3]) for r in rows]
    assert stage0 == sorted(stage0) and stage0[0] < stage0[-1]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "mbs_sweep.png").stat().st_size > 10_000


def test_scenario_example_prints_what_its_comment_says(tmp_path):
    block = next(b for b in python_blocks() if "distplan.scenario(\"llama3.1-70b\"" in b)
    expected = re.search(r"# (\d+): dp follows", block).group(1)
    assert run_block(block, tmp_path).strip() == expected


def test_grid_example_keeps_going_and_exports_the_best(tmp_path):
    block = next(b for b in python_blocks() if "errors=\"return\"" in b)
    out = run_block(block, tmp_path).splitlines()
    valid, total = re.match(r"(\d+) of (\d+) layouts are valid and fit; (\d+) refused", out[0]).group(1, 2)
    refused = int(re.match(r".*; (\d+) refused", out[0]).group(1))
    assert int(total) == 15 and refused > 0 and int(valid) > 0
    assert int(valid) + refused <= 15
    assert out[1].startswith("--") or out[1].startswith("#")
