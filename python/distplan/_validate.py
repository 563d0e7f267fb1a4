"""validate(): runs the ``distplan validate`` command (the GPU backend under mpirun, rank workers,
timeouts: docs/gpu_backend.md) and returns its ``distplan.validate/v1`` document. It runs as a
child process because it starts MPI ranks of itself; the scenario goes in on stdin."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any, Dict, Optional

from ._errors import InputError


def executable() -> str:
    """The ``distplan`` executable validate() runs: $DISTPLAN_EXECUTABLE, else the one installed
    with this package (bin/distplan beside this file), else the first on PATH."""
    env = os.environ.get("DISTPLAN_EXECUTABLE")
    if env:
        return env
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "distplan")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    found = shutil.which("distplan")
    if found:
        return found
    raise FileNotFoundError(
        "validate() runs the distplan executable, which `pip install .` leaves out (it needs MPI "
        "and the GPU backend): build it with `./build.sh build` and set "
        "DISTPLAN_EXECUTABLE=build/cli/distplan, or put distplan on PATH"
    )


def validate(
    scenario: Dict[str, Any],
    device: str = "cpu",
    steps: int = 3,
    timeout: Optional[float] = None,
) -> Dict[str, Any]:
    """Runs the scenario on the GPU backend (device "cpu" or "cuda", ``steps`` training steps, the
    last one measured) and returns predicted, measured and their relative errors
    (distplan.validate/v1). Bad input raises InputError with the CLI's path and code; a failed
    run raises RuntimeError with the CLI's message. ``timeout`` is the CLI's --timeout (seconds
    before every rank is killed; default: the CLI's)."""
    text = json.dumps(scenario, allow_nan=False)
    cmd = [executable(), "validate", "-", "--device", str(device), "--steps", str(int(steps))]
    if timeout is not None:
        cmd += ["--timeout", repr(float(timeout))]
    proc = subprocess.run(cmd, input=text, capture_output=True, text=True, check=False)
    if proc.returncode == 0:
        return json.loads(proc.stdout)
    error = _error_object(proc.stderr)
    if proc.returncode == 2 and error is not None:
        raise InputError(error.get("message", ""), error.get("path", ""), error.get("code", ""))
    if proc.returncode == 2:
        # CLI11 rejected an option (e.g. a device other than cpu or cuda): its text says which.
        raise InputError(proc.stderr.strip(), "", "invalid_input")
    message = error.get("message") if error else proc.stderr.strip()
    raise RuntimeError(f"distplan validate failed (exit {proc.returncode}): {message}")


def _error_object(stderr: str) -> Optional[Dict[str, Any]]:
    # The CLI's error is the last line of stderr: {"error": {"code", "path", "message"}}.
    for line in reversed(stderr.strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            return doc["error"]
    return None
