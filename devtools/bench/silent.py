"""A webhook receiver that accepts every connection and never answers: the approve-to-completed
part runs with one subscribed to every event, so a resume that waited on notifications would
show it."""

from __future__ import annotations

import socket
import threading

from notifications.endpoints import create_endpoint
from notifications.models import Delivery, Event, WebhookEndpoint


class SilentReceiver:
    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0), backlog=512)
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        self.port = self._server.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        threading.Thread(target=self._accept, name="silent-receiver", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                self._held.append(conn)  # read nothing, answer nothing, keep it open

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._held)

    def subscribe(self, tenant, user) -> None:
        """An active endpoint of the tenant for every event, pointing here."""
        create_endpoint(
            tenant=tenant,
            user=user,
            url=self.url,
            description="bench: never answers",
            events=[event.value for event in Event],
        )

    def unsubscribe(self, tenant) -> None:
        """Its endpoints and their deliveries gone, so that later parts do not try it again."""
        endpoints = WebhookEndpoint.objects.filter(tenant=tenant, url=self.url)
        Delivery.objects.filter(endpoint__in=endpoints).delete()
        endpoints.delete()

    def close(self) -> None:
        self._server.close()
        with self._lock:
            for conn in self._held:
                conn.close()
            self._held.clear()
