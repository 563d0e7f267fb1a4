"""CTest's entry to the pytest suite: runs it with this interpreter (the one the module was built
for). Without pytest the test is skipped (exit 77) and says how to install it, except under CI
(CI=true), where a missing pytest fails the run: the suite must run there."""

import importlib.util
import os
import sys

SKIP = 77

if importlib.util.find_spec("pytest") is None:
    print(f"pytest is not installed for {sys.executable}: install python3-pytest (Debian; "
          "./build.sh does) or `python3 -m pip install pytest`")
    sys.exit(1 if os.environ.get("CI") == "true" else SKIP)

import pytest  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", here, *sys.argv[1:]]))
