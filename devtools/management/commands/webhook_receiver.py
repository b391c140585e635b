"""A development aid: a tiny webhook receiver that verifies signatures and logs what arrives.

    manage.py webhook_receiver [--port 8025] [--secret whsec_...]

It verifies the way any receiver should: with the `standardwebhooks` library,
`Webhook(secret).verify(body, headers)` on the raw body (docs/NOTIFICATIONS.md). The port
defaults to $WEBHOOK_PORT (8025), where bin/run-dev starts it and seed_demo points acme's
demo webhook.

Without --secret (or WEBHOOK_SECRET) it checks against the secrets of the endpoints in the
database whose URL points at this receiver, re-read on every request: that is how the demo
endpoint made by seed_demo works without anyone copying its secret.

Not for production: one thread, no TLS, everything logged. It answers 204 to a delivery whose
signature and timestamp check out and 401 to anything else, so the console's delivery log
shows both outcomes. bin/run-dev starts it beside the web server with the demo secret.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections
from standardwebhooks import Webhook, WebhookVerificationError

from approvals.core import crypto
from notifications import endpoints, signing
from notifications.models import WebhookEndpoint

MAX_BODY = 1024 * 1024


def make_server(
    host: str, port: int, secrets: Callable[[], list[str]], log, *, status: int = 204
) -> ThreadingHTTPServer:
    """A receiver on host:port that accepts a signature made with any of secrets();
    log(line, verified, body, headers) is called for every request."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(min(length, MAX_BODY))
            problem = "no secret to check against"
            headers = {name.lower(): value for name, value in self.headers.items()}
            payload = None
            for secret in secrets():
                try:
                    payload = Webhook(secret).verify(body, headers)
                # A malformed signature header or secret raises ValueError, not the library's own.
                except (WebhookVerificationError, ValueError) as error:
                    problem = str(error) or type(error).__name__
                else:
                    problem = ""
                    break
            if problem:
                log(f"REFUSED {self.path}: {problem}", False, body, headers)
                self.send_response(401)
                self.end_headers()
                return
            event = payload.get("event", "?") if isinstance(payload, dict) else "?"
            log(f"verified {event}", True, body, headers)
            self.send_response(status)
            self.end_headers()

        def log_message(self, format: str, *args) -> None:  # noqa: A002
            pass  # the log callback says what matters

    return ThreadingHTTPServer((host, port), Handler)


class Command(BaseCommand):
    help = "Development aid: receive webhooks, verify their signatures and log them."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument(
            "--port",
            type=int,
            default=int(os.environ.get("WEBHOOK_PORT") or 8025),
            help="default: $WEBHOOK_PORT, else 8025",
        )
        parser.add_argument(
            "--secret",
            default=os.environ.get("WEBHOOK_SECRET", ""),
            help="the endpoint's signing secret (default: $WEBHOOK_SECRET)",
        )

    def handle(self, *args, host: str, port: int, secret: str, **options) -> None:
        def stored_secrets() -> list[str]:
            close_old_connections()
            found = []
            for endpoint in WebhookEndpoint.objects.filter(url__startswith=f"http://{host}:{port}"):
                try:
                    found.append(endpoints.endpoint_secret(endpoint))
                except crypto.CryptoError:
                    continue
            return found

        def log(line: str, verified: bool, body: bytes, headers: dict[str, str]) -> None:
            stamp = datetime.now(UTC).strftime("%H:%M:%S")
            try:
                summary = json.loads(body)
                summary = {k: summary.get(k) for k in ("id", "event", "status", "url")}
            except ValueError:
                summary = {"bytes": len(body)}
            print(f"[webhook {stamp}] {line} {json.dumps(summary)}", file=sys.stdout, flush=True)

        if secret:
            try:
                # An older endpoint's secret in base64's URL-safe alphabet is the same key.
                secret = signing.standard_secret(secret)
            except ValueError as error:
                raise CommandError(f"--secret: {error}") from None
        server = make_server(host, port, (lambda: [secret]) if secret else stored_secrets, log)
        source = "the given secret" if secret else "the secrets of the endpoints that point here"
        self.stdout.write(
            f"webhook receiver on http://{host}:{port}/ checking signatures with {source} "
            "(development aid)"
        )
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
