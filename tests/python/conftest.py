"""Shared fixtures of the Python module's tests: the CLI they compare against and the repository."""

import json
import os
import shutil
import subprocess

import pytest

import distplan

SOURCE_DIR = os.environ.get(
    "DISTPLAN_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
)


def cli_path():
    path = os.environ.get("DISTPLAN_CLI") or shutil.which("distplan")
    if not path:
        pytest.skip("the distplan CLI is needed to compare against (set DISTPLAN_CLI)")
    return path


def run_cli(args, document=None):
    """Runs `distplan ARGS` with the document on stdin; returns (exit code, stdout, stderr)."""
    stdin = None if document is None else json.dumps(document)
    proc = subprocess.run(
        [cli_path(), *args], input=stdin, capture_output=True, text=True, check=False
    )
    return proc.returncode, proc.stdout, proc.stderr


def cli_json(args, document=None):
    rc, out, err = run_cli(args, document)
    assert rc == 0, err
    return json.loads(out)


def cli_error(args, document):
    rc, _, err = run_cli(args, document)
    assert rc == 2, err
    return json.loads(err.strip().splitlines()[-1])["error"]


@pytest.fixture()
def default():
    return distplan.default_scenario()


@pytest.fixture()
def source_dir():
    return SOURCE_DIR
