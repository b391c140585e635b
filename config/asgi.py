"""ASGI entry point: HTTP through Django, websockets through channels."""

from __future__ import annotations

import os

import django
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup(set_prefix=False)


class SyncChainASGIHandler(ASGIHandler):
    """Django's ASGI handler with the middleware chain built synchronous, as under WSGI: a request
    makes one hop to the thread its views run in, not one per adaptation.

    The console's views and most of its middleware are synchronous. Built asynchronous, the
    chain crosses between the server's event loop and that thread again for every middleware
    that can run async between sync ones, for every process_view hook and for the view (each
    crossing waits for the loop, which also serves the sockets and sends the live hints). Here
    the whole chain runs in one sync_to_async call, thread-sensitive as Django's own adaptation
    is, so the views keep the one thread their database connection lives in.
    """

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def get_response_async(self, request):
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


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
