"""The ASGI application serves HTTP through a synchronous middleware chain (one hop to the
view's thread per request), with every middleware still in it."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator

from config.asgi import application, django_asgi_app

pytestmark = pytest.mark.django_db(transaction=True)


def _request(method: str, path: str, body: bytes = b"", headers=()) -> tuple[int, dict, bytes]:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }

    async def exchange():
        communicator = ApplicationCommunicator(application, scope)
        await communicator.send_input({"type": "http.request", "body": body})
        start = await communicator.receive_output(timeout=10)
        content = b""
        while True:
            part = await communicator.receive_output(timeout=10)
            content += part.get("body", b"")
            if not part.get("more_body"):
                break
        await communicator.wait(timeout=10)
        return start["status"], {k.lower(): v for k, v in start["headers"]}, content

    return async_to_sync(exchange)()


def test_the_middleware_chain_is_built_synchronous():
    assert not asyncio.iscoroutinefunction(django_asgi_app._middleware_chain)


def test_a_page_is_served_through_the_whole_chain():
    status, headers, content = _request("GET", "/login/")

    assert status == 200
    assert b"password" in content.lower()
    # The console's own headers and the session middleware's cookie: the chain ran.
    assert headers[b"x-frame-options"] == b"DENY"
    assert b"csrftoken" in headers.get(b"set-cookie", b"")


def test_a_post_without_its_csrf_token_is_refused_by_the_chain():
    status, _, _ = _request(
        "POST",
        "/login/",
        body=b"login=someone&password=wrong",
        headers=[(b"content-type", b"application/x-www-form-urlencoded")],
    )

    assert status == 403
