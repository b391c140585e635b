"""ASGI entry point: HTTP through Django, websockets through channels."""

from __future__ import annotations

import asyncio
import contextvars
import os
from concurrent.futures import ThreadPoolExecutor

import django
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.handlers.asgi import ASGIHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup(set_prefix=False)

# The request being served abandoned its thread: a hop to it was cancelled while the thread may
# still run the view. Set per request by SyncChainASGIHandler.
_abandoned: contextvars.ContextVar[list[bool]] = contextvars.ContextVar("request_abandoned")


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

    @staticmethod
    def _new_thread() -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="request")

    async def get_response_async(self, request):
        try:
            return await sync_to_async(self.get_response, thread_sensitive=True)(request)
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
