"""README's "Getting started" shows what the CLI prints: every block after a marker

    <!-- getting started: ARGS | lines SPEC -->

is the output of `distplan ARGS` (run in a folder holding the repository's data/ and the files the
section makes: runs.json, calibration.json), restricted to the 1-based line ranges of SPEC
("1-4,9-12"; "all"), with a line "…" where ranges are apart. DISTPLAN_WRITE_DOCS=1 rewrites the
blocks from the CLI instead of comparing them (after a change of the model, say)."""

import json
import os
import re
import shlex

import pytest

from conftest import SOURCE_DIR, run_cli

MARKER = re.compile(r"<!-- getting started: (.*?) \| lines ([0-9,\-all]+) -->\n```\n(.*?)```\n", re.S)


def readme():
    with open(os.path.join(SOURCE_DIR, "README.md")) as f:
        return f.read()


def select(output, spec):
    lines = output.rstrip("\n").split("\n")
    if spec == "all":
        return "\n".join(lines) + "\n"
    picked = []
    previous_end = None
    for part in spec.split(","):
        first, _, last = part.partition("-")
        first, last = int(first), int(last or first)
        assert last <= len(lines), f"lines {spec}: the output has {len(lines)} lines"
        if previous_end is not None and first != previous_end + 1:
            picked.append("…")
        picked.extend(lines[first - 1 : last])
        previous_end = last
    return "\n".join(picked) + "\n"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder with data/ and the section's files: runs.json is the first four published runs of
    Korthikanti et al. 2022, Table 5 (`jq '{runs: .cases[0:4]}'` of the reference file), and
    calibration.json what `distplan calibrate runs.json` writes."""
    d = tmp_path_factory.mktemp("getting-started")
    os.symlink(os.path.join(SOURCE_DIR, "data"), d / "data")
    with open(os.path.join(SOURCE_DIR, "data", "reference", "korthikanti2022_table5.json")) as f:
        cases = json.load(f)["cases"][0:4]
    (d / "runs.json").write_text(json.dumps({"runs": cases}))
    old = os.getcwd()
    os.chdir(d)
    try:
        rc, out, err = run_cli(["calibrate", "runs.json"])
        assert rc == 0, err
        (d / "calibration.json").write_text(out)
    finally:
        os.chdir(old)
    return d


def cli_output(args, cwd):
    # `validate` starts MPI ranks: Open MPI as root on one machine needs these (build.sh sets them).
    for key, value in {
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMPI_MCA_btl": "self,vader",
        "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
        "OMPI_MCA_rmaps_base_oversubscribe": "1",
    }.items():
        os.environ.setdefault(key, value)
    old = os.getcwd()
    os.chdir(cwd)
    try:
        rc, out, err = run_cli(shlex.split(args))
    finally:
        os.chdir(old)
    assert rc == 0, f"distplan {args}: {err}"
    return out


def test_getting_started_blocks_are_what_the_cli_prints(workdir):
    text = readme()
    blocks = list(MARKER.finditer(text))
    assert len(blocks) >= 6, "the Getting started section has lost its commands"
    rewritten = text
    for m in blocks:
        args, spec, shown = m.group(1), m.group(2), m.group(3)
        # The command the reader sees just above is the one whose output this is.
        assert f"./build/cli/distplan {args}\n```" in text[max(0, m.start() - 400) : m.start()], args
        want = select(cli_output(args, workdir), spec)
        if os.environ.get("DISTPLAN_WRITE_DOCS") == "1":
            marker = m.group(0)[: m.group(0).index("\n```\n")]
            rewritten = rewritten.replace(m.group(0), f"{marker}\n```\n{want}```\n", 1)
            continue
        assert shown == want, f"README block of `distplan {args}` differs from the CLI's output"
    if rewritten != text:
        with open(os.path.join(SOURCE_DIR, "README.md"), "w") as f:
            f.write(rewritten)


def test_getting_started_keeps_the_two_setup_commands_first():
    text = readme()
    setup = text.index("## Set up on a fresh Debian 12 machine")
    start = text.index("## Getting started")
    assert setup < start
    commands = re.findall(r"```\n(\./build\.sh \w+)\n```", text[:start])
    assert commands == ["./build.sh run", "./build.sh test"]
