"""The approvals services the API calls that a deployment may not have yet.

Starting runs, handing over a pause and reporting a caller's outcome are capabilities of
approvals (approvals.runs.start, approvals.runs.remote); when this build lacks one, its
operation answers 501 saying so, instead of failing at import.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from api.errors import ApiError


def find(module: str, name: str) -> Callable[..., Any] | None:
    """module.name, or None when this build does not have it."""
    try:
        found = importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name is not None and module.startswith(error.name):
            return None
        raise
    return getattr(found, name, None)


def require(module: str, name: str) -> Callable[..., Any]:
    """module.name; ApiError 501 when this build does not have it."""
    service = find(module, name)
    if service is None:
        raise ApiError(
            501,
            "not_implemented",
            f"This console does not offer this operation yet ({module}.{name} is missing).",
        )
    return service
