from __future__ import annotations

from django.urls import path

from approvals.live.consumers import ConsoleConsumer

websocket_urlpatterns = [
    path("ws/console/", ConsoleConsumer.as_asgi()),
]
