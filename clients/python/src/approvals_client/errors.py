"""What the client raises: the console said no (ApiError), or a decision fails its checks."""

from __future__ import annotations

from typing import Any


class ApprovalsError(Exception):
    """Base of every error this package raises (network errors stay httpx's own)."""


class ApiError(ApprovalsError):
    """The console answered with an error status: {"detail": "<one sentence>", "code": "..."}.

    `errors` holds the field-by-field list of a 422, when the console sent one.
    """

    def __init__(
        self, status: int, detail: str, code: str = "", *, errors: list[Any] | None = None
    ) -> None:
        super().__init__(f"{status} {code}: {detail}" if code else f"{status}: {detail}")
        self.status = status
        self.detail = detail
        self.code = code
        self.errors = errors or []


class DecisionRefused(ApprovalsError):
    """A signed decision failed a check: nothing was applied to the state."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class WaitTimeout(ApprovalsError, TimeoutError):
    """wait_for_decisions ran out of time; `run` is the last answer, still being decided."""

    def __init__(self, run: Any, timeout: float) -> None:
        super().__init__(f"run {run.id} is still {run.status} after {timeout:g} seconds")
        self.run = run
        self.timeout = timeout
