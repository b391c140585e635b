"""Middleware: security headers on every response, a lost database answered with 503."""

from __future__ import annotations

from django.db import DataError, OperationalError
from django.http import HttpResponse
from django.test import RequestFactory

from approvals.middleware import (
    CONSOLE_CSP,
    DatabaseUnavailableMiddleware,
    SecurityHeadersMiddleware,
    UnstorableValueMiddleware,
)


def test_security_headers_middleware_sets_a_strict_policy():
    response = SecurityHeadersMiddleware(lambda request: HttpResponse("ok"))(
        RequestFactory().get("/")
    )

    assert response["Content-Security-Policy"] == CONSOLE_CSP
    assert "script-src 'self'" in response["Content-Security-Policy"]
    assert "'unsafe-inline'" not in response["Content-Security-Policy"]
    assert response["Cross-Origin-Opener-Policy"] == "same-origin"


def test_database_unavailable_middleware_answers_503_with_what_to_do():
    request = RequestFactory().post("/tickets/1/decide/")
    middleware = DatabaseUnavailableMiddleware(lambda request: HttpResponse("unused"))

    response = middleware.process_exception(
        request, OperationalError("server closed the connection")
    )

    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert b"Nothing was changed" in response.content
    assert b"server closed the connection" not in response.content


def test_database_unavailable_middleware_leaves_other_errors_alone():
    middleware = DatabaseUnavailableMiddleware(lambda request: HttpResponse("unused"))

    assert middleware.process_exception(RequestFactory().get("/"), ValueError("x")) is None


def test_unstorable_value_middleware_answers_400_with_the_reason():
    request = RequestFactory().post("/policies/groups/delete/")
    middleware = UnstorableValueMiddleware(lambda request: HttpResponse("unused"))

    response = middleware.process_exception(
        request, DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
    )
    other = middleware.process_exception(request, ValueError("not ours"))

    assert response.status_code == 400
    assert "a NUL byte in a text" in response.content.decode()
    assert "Nothing was changed" in response.content.decode()
    assert other is None
