"""The ASGI application serves HTTP through a synchronous middleware chain (one hop to the
view's thread per request), with every middleware still in it."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.core import signals

from approvals.live import hints
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


# --- the request threads the process keeps ----------------------------------------------------


def _scope(path: str, query: bytes = b"") -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }


@pytest.fixture
def served_on(monkeypatch):
    """The thread each request's chain ran on, in order; a request with ?held=1 waits in its
    thread until held.release is set (held.started is set once it waits)."""
    threads: list[threading.Thread] = []
    held = SimpleNamespace(started=threading.Event(), release=threading.Event(), count=0)
    original = django_asgi_app.get_response

    def get_response(request):
        threads.append(threading.current_thread())
        if request.GET.get("held"):
            held.count += 1
            held.started.set()
            assert held.release.wait(timeout=10), "a held request was never released"
        return original(request)

    monkeypatch.setattr(django_asgi_app, "get_response", get_response)
    yield threads, held
    held.release.set()


async def _served(communicator: ApplicationCommunicator) -> int:
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(timeout=10)
    while (await communicator.receive_output(timeout=10)).get("more_body"):
        pass
    await communicator.wait(timeout=10)
    return start["status"]


def test_requests_one_after_another_are_served_on_one_kept_thread(served_on):
    threads, _ = served_on

    first, _, _ = _request("GET", "/login/")
    second, _, _ = _request("GET", "/login/")

    assert (first, second) == (200, 200)
    assert len(threads) == 2
    # One thread, lent to each request in turn: not the server's, not one started per request.
    assert threads[0] is threads[1]
    assert threads[0] is not threading.main_thread()
    assert threads[0].name.startswith("request")
    assert threads[0].is_alive()


def test_a_thread_whose_client_went_away_mid_view_is_never_lent_again(served_on):
    threads, held = served_on

    async def exchange():
        gone = ApplicationCommunicator(application, _scope("/login/", b"held=1"))
        await gone.send_input({"type": "http.request", "body": b""})
        assert await asyncio.to_thread(held.started.wait, 10)
        await gone.send_input({"type": "http.disconnect"})
        # The abandoned view still runs; the next request neither waits behind it nor gets
        # its thread.
        status = await _served(ApplicationCommunicator(application, _scope("/login/")))
        still_held = not held.release.is_set()
        held.release.set()
        await gone.wait(timeout=10)
        return status, still_held

    assert async_to_sync(exchange)() == (200, True)
    abandoned, next_one = threads
    assert next_one is not abandoned
    # Its view done, the abandoned thread ends rather than waiting to be lent again.
    abandoned.join(timeout=10)
    assert not abandoned.is_alive()
    assert next_one.is_alive()
    assert next_one in [t for e in django_asgi_app._idle for t in e._threads]


def test_no_more_threads_are_kept_than_the_idle_limit(served_on, monkeypatch):
    threads, held = served_on
    monkeypatch.setattr(django_asgi_app, "IDLE_THREADS", 1)
    monkeypatch.setattr(django_asgi_app, "_idle", [])

    async def exchange():
        both = [
            ApplicationCommunicator(application, _scope("/login/", b"held=1")) for _ in range(2)
        ]
        waiting = [asyncio.ensure_future(_served(c)) for c in both]

        def both_held() -> bool:
            while held.count < 2:
                if not held.started.wait(timeout=10):
                    return False
                held.started.clear()
            return True

        assert await asyncio.to_thread(both_held)
        held.release.set()
        return await asyncio.gather(*waiting)

    assert async_to_sync(exchange)() == [200, 200]
    # Two requests at once had a thread each; one thread is kept, the other ends.
    assert len(set(threads)) == 2
    kept = [t for e in django_asgi_app._idle for t in e._threads]
    assert len(kept) == 1 and kept[0] in threads
    ended = next(t for t in threads if t is not kept[0])
    ended.join(timeout=10)
    assert not ended.is_alive()


# --- one hop to the request's thread ahead of the view ----------------------------------------


class _CountingThread(ThreadPoolExecutor):
    """A request thread that notes each piece of work handed to it."""

    handed: list[str] = []

    def submit(self, fn, /, *args, **kwargs):
        _CountingThread.handed.append(getattr(fn, "__qualname__", repr(fn)))
        return super().submit(fn, *args, **kwargs)


def test_request_started_runs_in_the_views_hop_before_the_chain(served_on, monkeypatch):
    """Django's handler hands request_started's receivers to the request's thread in a hop of
    their own before the view's; here they run at the start of the view's hop: two hops per
    request (the view's, the response's close after it is sent), not three."""
    threads, _ = served_on
    order: list[tuple[str, threading.Thread]] = []
    monkeypatch.setattr(_CountingThread, "handed", [])
    monkeypatch.setattr(django_asgi_app, "_idle", [])
    monkeypatch.setattr(
        django_asgi_app,
        "_new_thread",
        lambda: _CountingThread(max_workers=1, thread_name_prefix="request"),
    )
    original = django_asgi_app.get_response

    def get_response(request):
        order.append(("view", threading.current_thread()))
        return original(request)

    def started(**kwargs):
        assert kwargs["scope"]["path"] == "/login/"
        order.append(("started", threading.current_thread()))

    monkeypatch.setattr(django_asgi_app, "get_response", get_response)
    signals.request_started.connect(started)
    try:
        status, _, _ = _request("GET", "/login/")
    finally:
        signals.request_started.disconnect(started)

    assert status == 200
    assert [step for step, _ in order] == ["started", "view"]
    # The same kept request thread, in one piece of work: the signal's, then the chain's.
    assert order[0][1] is order[1][1] is threads[0]
    assert len(_CountingThread.handed) == 2


def test_a_request_refused_as_it_is_built_still_sends_request_started(monkeypatch):
    heard = []

    def started(**kwargs):
        heard.append(kwargs["scope"]["path"])

    signals.request_started.connect(started)
    try:
        # A query string that is not UTF-8: Django refuses to build the request (400).
        status = async_to_sync(_served)(
            ApplicationCommunicator(application, _scope("/login/", b"next=\xff"))
        )
    finally:
        signals.request_started.disconnect(started)

    assert status == 400
    assert heard == ["/login/"]


def test_a_views_hints_go_out_once_its_answer_is_sent(monkeypatch):
    """The live hints a view's commits send are held until its answer is sent, then handed to
    the layer from the server's loop: their Redis work never runs beside the answer."""
    events: list[tuple] = []

    class Layer:
        async def group_send(self, group: str, message: dict) -> None:
            events.append(("hint", group, message["kind"], threading.current_thread()))

    monkeypatch.setattr(hints, "_shared_layer", Layer)
    monkeypatch.setattr(hints, "get_channel_layer", Layer)
    monkeypatch.setattr(hints, "_sender", hints._SenderLoop())
    original = django_asgi_app.get_response

    def get_response(request):
        hints._send("tenant.7", {"type": "console.event", "kind": "run.changed", "tenant": 7})
        events.append(("view",))
        return original(request)

    monkeypatch.setattr(django_asgi_app, "get_response", get_response)

    async def exchange() -> threading.Thread:
        request = [{"type": "http.request", "body": b""}]

        async def receive():
            if request:
                return request.pop()
            await asyncio.Event().wait()  # the client stays

        async def send(message):
            events.append(("sent", message["type"]))

        await django_asgi_app(_scope("/login/"), receive, send)
        assert await sync_to_async(hints._sender.wait_sent, thread_sensitive=False)()
        return threading.current_thread()

    server_thread = async_to_sync(exchange)()

    assert [e[:3] for e in events] == [
        ("view",),
        ("sent", "http.response.start"),
        ("sent", "http.response.body"),
        ("hint", "tenant.7", "run.changed"),
    ]
    # Sent by the server's loop itself, not a loop of the process's own.
    assert events[-1][3] is server_thread
