"""The one place where a refused API request becomes its answer: `{"detail", "code"}`.

A domain error (approvals.core.errors) answers its own status and sentence, the same the page
shows; a request that does not fit the schema answers 422 field by field; a lost database
answers 503. Another tenant's object is raised as a 404 exactly like a missing one.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from django.db import DataError, InterfaceError, OperationalError, connection
from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from approvals.core.errors import DomainError

logger = logging.getLogger(__name__)


class ApiError(Exception):
    """A refusal of the API itself (not of a capability): its status, code and sentence."""

    def __init__(
        self, status: int, code: str, detail: str, *, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = headers or {}


def not_found(what: str) -> ApiError:
    return ApiError(404, "not_found", f"No such {what}.")


def code_of(error: DomainError) -> str:
    """A domain error's code: its own, or its class name in snake_case (SelfApprovalError:
    self_approval)."""
    code = getattr(error, "code", "")
    if code:
        return code
    name = type(error).__name__.removesuffix("Error") or "refused"
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _answer(
    api: NinjaAPI,
    request: HttpRequest,
    status: int,
    code: str,
    detail: str,
    *,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> HttpResponse:
    response = api.create_response(
        request, {"detail": detail, "code": code, **extra}, status=status
    )
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def field_errors(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each field's problem, without the input it was given (it may hold anything)."""
    return [
        {"loc": [str(part) for part in error.get("loc", ())], "msg": str(error.get("msg", ""))}
        for error in errors
    ]


def _validation_sentence(errors: list[dict[str, Any]]) -> str:
    parts = [f"{'.'.join(e['loc']) or 'request'}: {e['msg']}" for e in errors[:5]]
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "The request is not valid: " + "; ".join(parts).rstrip(".") + more + "."


def install(api: NinjaAPI) -> None:
    """Connect every handler to the API: no exception leaves it as a 500 page."""

    @api.exception_handler(ApiError)
    def api_error(request: HttpRequest, error: ApiError) -> HttpResponse:
        return _answer(api, request, error.status, error.code, error.detail, headers=error.headers)

    @api.exception_handler(DomainError)
    def domain_error(request: HttpRequest, error: DomainError) -> HttpResponse:
        headers = {}
        retry_after = getattr(error, "retry_after", None)
        if retry_after is not None:
            headers["Retry-After"] = str(retry_after)
        return _answer(
            api, request, error.status, code_of(error), error.sentence(), headers=headers
        )

    @api.exception_handler(ValidationError)
    def validation_error(request: HttpRequest, error: ValidationError) -> HttpResponse:
        errors = field_errors(error.errors)
        return _answer(
            api, request, 422, "invalid_request", _validation_sentence(errors), errors=errors
        )

    @api.exception_handler(AuthenticationError)
    def authentication_error(request: HttpRequest, error: AuthenticationError) -> HttpResponse:
        return _answer(api, request, 401, "token_missing", "Send an API token.")

    @api.exception_handler(Http404)
    def http404(request: HttpRequest, error: Http404) -> HttpResponse:
        return _answer(api, request, 404, "not_found", str(error) or "Not found.")

    @api.exception_handler(HttpError)
    def http_error(request: HttpRequest, error: HttpError) -> HttpResponse:
        # Raised by the framework itself, e.g. a body that is not JSON.
        detail = str(error).rstrip(".") + "."
        return _answer(api, request, error.status_code, "bad_request", detail)

    @api.exception_handler(DataError)
    def unstorable(request: HttpRequest, error: DataError) -> HttpResponse:
        return _answer(
            api,
            request,
            400,
            "unstorable_value",
            "The request held a value the console cannot store (a NUL byte in a text, or a "
            "number out of range); nothing was changed.",
        )

    @api.exception_handler(OperationalError)
    @api.exception_handler(InterfaceError)
    def database_unavailable(request: HttpRequest, error: Exception) -> HttpResponse:
        logger.warning("database unavailable during %s %s: %s", request.method, request.path, error)
        connection.close_if_unusable_or_obsolete()
        return _answer(
            api,
            request,
            503,
            "unavailable",
            "The database did not answer. Nothing was changed; try again in a moment.",
            headers={"Retry-After": "5"},
        )
