"""ASGI entry point: HTTP through Django, websockets through channels."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
from concurrent.futures import ThreadPoolExecutor

import django
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.urls import set_script_prefix

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup(set_prefix=False)

from approvals.live import hints  # noqa: E402

# The request being served abandoned its thread: a hop to it was cancelled while the thread may
# still run the view. Set per request by SyncChainASGIHandler.
_abandoned: contextvars.ContextVar[list[bool]] = contextvars.ContextVar("request_abandoned")
# The request being served, from its handle() to its view's hop: its scope (request_started is
# sent in the view's own hop) and the live hints its view holds until the answer is sent.
_serving: contextvars.ContextVar[tuple[dict, list] | None] = contextvars.ContextVar(
    "request_serving", default=None
)


class SyncChainASGIHandler(ASGIHandler):
    """Django's ASGI handler with the middleware chain built synchronous, as under WSGI: a request
    makes one hop to the thread its views run in, not one per adaptation; and that thread is
    one the process keeps, as a WSGI server's are.

    The console's views and most of its middleware are synchronous. Built asynchronous, the
    chain crosses between the server's event loop and that thread again for every middleware
    that can run async between sync ones, for every process_view hook and for the view (each
    crossing waits for the loop, which also serves the sockets and sends the live hints). Here
    the whole chain runs in one sync_to_async call, thread-sensitive as Django's own adaptation
    is, so the views keep the one thread their database connection lives in.

    Django's handler gives each request a thread of its own, started for it and joined by
    another thread after it. Here a request borrows one of the process's idle request threads
    (a new one when all are busy) and gives it back once its work there is done; at most
    IDLE_THREADS wait between requests. When a request's hop to its thread is cancelled (its
    client went away, or the server cancelled the call) the view may still be running there:
    that thread finishes it and ends, and is never lent again. (Django's handler itself waits
    for the view after a disconnect, since its request_finished signal runs on the same thread;
    a server that cancels the whole call does not wait.)

    Django sends request_started from the event loop (Signal.asend), which runs its synchronous
    receivers (the database connections' check, the query log's reset) in a hop of their own
    to the request's thread, ahead of the view's hop. Here they run at the start of the view's
    hop, on that same thread and still before the middleware and the view: one hop fewer on
    the way to every answer. (The response is still closed, request_finished, in a hop after
    it is sent: closed before, its work would delay the answer.)

    The live hints a view's commits send (approvals.live.hints) are held until its answer is
    sent, then handed to the layer from this loop: their Redis work no longer runs beside the
    end of the view and the sending of its answer. A streamed answer's go before it streams;
    the view of a request whose client went away while it ran sends its own when it ends. (A
    client gone in the instant between the view's end and its answer takes the hints with it:
    a hint only says what to re-read, and the page re-reads on its next poll.)
    """

    IDLE_THREADS = 8

    def __init__(self) -> None:
        super().__init__()
        self._idle: list[ThreadPoolExecutor] = []

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            # Django's own refusal: only HTTP comes here (config.asgi routes the rest).
            return await super().__call__(scope, receive, send)
        thread = self._idle.pop() if self._idle else self._new_thread()
        abandoned: list[bool] = []
        token = _abandoned.set(abandoned)
        try:
            async with ThreadSensitiveContext(executor=thread):
                await self.handle(scope, receive, send)
        except BaseException:
            abandoned.append(True)
            raise
        finally:
            _abandoned.reset(token)
            if abandoned or len(self._idle) >= self.IDLE_THREADS:
                # Its queued work (a view still running) finishes first; then the thread ends.
                thread.shutdown(wait=False)
            else:
                self._idle.append(thread)

    async def handle(self, scope, receive, send):
        """ASGIHandler.handle (Django 5.2) with request_started sent in the view's hop (see the
        class): the request is built before the signal's receivers run rather than after, which
        none of them reads; a request refused as it is built sends the signal before its
        error answer, as Django does."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            await signals.request_started.asend(sender=self.__class__, scope=scope)
            body_file.close()
            await self.send_response(error_response, send)
            await sync_to_async(error_response.close)()
            return

        async def process_request(request, send):
            held: list = []
            token = _serving.set((scope, held))
            try:
                response = await self.run_get_response(request)
            finally:
                _serving.reset(token)
            if response.streaming:
                hints.send_held(held)
                held = []
            # A client gone while the answer is sent: nothing more to do.
            with contextlib.suppress(asyncio.CancelledError):
                await self.send_response(response, send)
            hints.send_held(held)
            return response

        # As Django's: a disconnect while the response is made cancels making it.
        tasks = [
            asyncio.create_task(self.listen_for_disconnect(receive)),
            asyncio.create_task(process_request(request, send)),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass
                except AssertionError:
                    body_file.close()
                    raise
            else:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        try:
            response = tasks[1].result()
        except asyncio.CancelledError:
            await signals.request_finished.asend(sender=self.__class__)
        else:
            await sync_to_async(response.close)()
        body_file.close()

    @staticmethod
    def _new_thread() -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="request")

    async def get_response_async(self, request):
        serving = _serving.get()
        abandoned = _abandoned.get(None)

        def respond(request):
            if serving is None:
                return self.get_response(request)
            scope, held = serving
            with hints.held(held):
                signals.request_started.send(sender=self.__class__, scope=scope)
                response = self.get_response(request)
            if abandoned:
                # Nobody waits for this answer: its hints go now, from here.
                hints.send_held(held, on_loop=False)
            return response

        try:
            return await sync_to_async(respond, thread_sensitive=True)(request)
        except asyncio.CancelledError:
            # The view may still run in the thread: no later request is to queue behind it.
            if (abandoned := _abandoned.get(None)) is not None:
                abandoned.append(True)
            raise


django_asgi_app = SyncChainASGIHandler()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from config.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
