"""distplan from Python: plan, simulate, search, calibrate and validate distributed training layouts with the
same C++ core and the same JSON documents as the ``distplan`` CLI (docs/api.md, docs/python.md).

Every function takes and returns plain dicts; bad input raises :class:`InputError` with the CLI's
JSON pointer (``.path``) and code (``.code``)."""

from ._distplan import (
    __version__,
    calibrate,
    default_scenario,
    plan,
    plan_many,
    presets,
    search,
    simulate,
)
from ._errors import InputError
from ._export import export
from ._scenario import scenario
from ._validate import validate

__all__ = [
    "InputError",
    "__version__",
    "calibrate",
    "default_scenario",
    "export",
    "plan",
    "plan_many",
    "presets",
    "scenario",
    "search",
    "simulate",
    "validate",
]
