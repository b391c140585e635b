"""Security headers for every response: a strict Content-Security-Policy and friends."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings
from django.db import DataError, InterfaceError, OperationalError, connection
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render

logger = logging.getLogger(__name__)

# No inline script or style anywhere in the console: everything comes from /static/.
CONSOLE_CSP = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "font-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
# Django's admin ships a few inline styles of its own; it gets the same policy minus that.
ADMIN_CSP = CONSOLE_CSP.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'")


def _with_form_targets(policy: str, origins: list[str]) -> str:
    """The policy whose form-action also allows these origins (a "Sign in with ..." form posts
    here and is redirected to the single sign-on provider, which form-action also checks)."""
    if not origins:
        return policy
    return policy.replace("form-action 'self'", "form-action 'self' " + " ".join(origins))


class SecurityHeadersMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        origins = list(getattr(settings, "CSP_FORM_ACTION_ORIGINS", []))
        self.console_csp = _with_form_targets(CONSOLE_CSP, origins)
        self.admin_csp = _with_form_targets(ADMIN_CSP, origins)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        policy = self.admin_csp if request.path.startswith("/admin/") else self.console_csp
        response.headers.setdefault("Content-Security-Policy", policy)
        response.headers.setdefault("Cross-Origin-Opener-Policy", "same-origin")
        response.headers.setdefault(
            "Permissions-Policy", "camera=(), microphone=(), geolocation=()"
        )
        return response


class DatabaseUnavailableMiddleware:
    """A lost database connection answers 503 with what to do, not a 500 with a traceback.

    Every write runs in a transaction, so a request that fails this way has changed nothing.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, OperationalError | InterfaceError):
            return None
        logger.warning(
            "database unavailable during %s %s: %s", request.method, request.path, exception
        )
        # Drop the broken connection so the next request opens a fresh one.
        connection.close_if_unusable_or_obsolete()
        response = render(
            request,
            "approvals/unavailable.html",
            {"reason": "The database did not answer. Nothing was changed; try again in a moment."},
            status=503,
        )
        response["Retry-After"] = "5"
        return response


class UnstorableValueMiddleware:
    """A value the database refuses (a NUL byte in text, a number out of range) answers 400
    with what was wrong, not a 500: every write runs in a transaction, so nothing changed."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, DataError):
            return None
        logger.info(
            "refused an unstorable value in %s %s: %s", request.method, request.path, exception
        )
        return HttpResponseBadRequest(
            "The request held a value the console cannot store (a NUL byte in a text, or a number "
            "out of range). Nothing was changed; correct it and try again.",
            content_type="text/plain; charset=utf-8",
        )
