"""The SSRF guard: webhooks to private, loopback, link-local and other non-public addresses are
refused at save time and at send time (NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS off), and a request
goes to the address that was checked, never to a second lookup of the name.

No test reaches real DNS: targets._resolve (the one lookup) is replaced, and socket.getaddrinfo
is watched so that a lookup of a name anywhere else fails the test.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.urls import reverse

from approvals.models import AuditEvent
from notifications import deliveries, targets, transport
from notifications.models import WebhookEndpoint
from tests.notifications.conftest import make_endpoint
from tests.notifications.test_deliveries import one_delivery

pytestmark = pytest.mark.django_db

PUBLIC = "93.184.215.14"


@pytest.fixture
def refuse_private(settings):
    settings.NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS = False


class FakeDNS:
    """A resolver table, name -> addresses (an unknown name does not resolve), and the names
    socket.getaddrinfo was asked for: only targets._resolve, replaced, may look a name up."""

    def __init__(self) -> None:
        self.names: dict[str, list[str]] = {}
        # Names asked of the real resolver (must stay empty) and of the fake one.
        self.looked_up: list[str] = []
        self.resolved: list[str] = []

    def __setitem__(self, name: str, addresses: list[str]) -> None:
        self.names[name] = addresses


@pytest.fixture
def dns(monkeypatch) -> FakeDNS:
    fake = FakeDNS()
    real_getaddrinfo = socket.getaddrinfo

    def resolve(host, port):
        fake.resolved.append(host)
        if host not in fake.names:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [ipaddress.ip_address(a) for a in fake.names[host]]

    def getaddrinfo(host, *args, **kwargs):
        try:
            ipaddress.ip_address(host)
        except ValueError:
            fake.looked_up.append(host)
            raise socket.gaierror(socket.EAI_NONAME, f"no real DNS in tests: {host}") from None
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(targets, "_resolve", resolve)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return fake


class Hits:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []  # (path, Host header)
        self.sni: list[str | None] = []


def _serve(tls: ssl.SSLContext | None = None):
    hits = Hits()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            hits.requests.append((self.path, self.headers.get("Host")))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        tls.sni_callback = lambda sock, name, ctx: hits.sni.append(name)
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread, hits


@pytest.fixture
def loopback():
    server, thread, hits = _serve()
    hits.port = server.server_address[1]
    yield hits
    server.shutdown()
    server.server_close()
    thread.join(5)


# --- which addresses --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "a loopback address"),
        ("127.8.9.10", "a loopback address"),
        ("::1", "a loopback address"),
        ("10.1.2.3", "a private address"),
        ("172.16.0.1", "a private address"),
        ("192.168.1.1", "a private address"),
        ("fc00::1", "a private address"),
        ("fec0::1", "a private address"),
        ("169.254.169.254", "a link-local address"),
        ("fe80::1", "a link-local address"),
        ("100.64.0.1", "a shared (carrier-grade NAT) address"),
        ("0.0.0.0", "an unspecified address"),
        ("::", "an unspecified address"),
        ("0.1.2.3", "a private address"),
        ("224.0.0.1", "a multicast address"),
        ("ff02::1", "a multicast address"),
        ("240.0.0.1", "a reserved address"),
        ("255.255.255.255", "a reserved address"),
        ("192.0.2.1", "a private address"),
        ("198.18.0.1", "a private address"),
        ("2001:db8::1", "a private address"),
        # IPv4 inside IPv6: mapped, NAT64, 6to4 and the old IPv4-compatible form.
        ("::ffff:127.0.0.1", "a loopback address"),
        ("::ffff:169.254.169.254", "a link-local address"),
        ("64:ff9b::a00:1", "a private address"),
        ("2002:7f00:1::1", "a loopback address"),
        ("::10.0.0.1", "a private address"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "a private address"),  # Teredo
        # Public.
        ("8.8.8.8", ""),
        (PUBLIC, ""),
        ("2606:4700:4700::1111", ""),
        ("::ffff:8.8.8.8", ""),
        ("64:ff9b::808:808", ""),
        ("2002:808:808::1", ""),
    ],
)
def test_targets_blocked_reason(address, reason):
    assert targets.blocked_reason(ipaddress.ip_address(address)) == reason


# --- at save time -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "http://127.0.0.1:8025/",
            "127.0.0.1 is a loopback address; webhooks may only go to public addresses.",
        ),
        (
            "http://169.254.169.254/latest/meta-data/",
            "169.254.169.254 is a link-local address; webhooks may only go to public addresses.",
        ),
        (
            "https://[::1]/hook",
            "::1 is a loopback address; webhooks may only go to public addresses.",
        ),
        (
            "https://[::ffff:10.0.0.5]/hook",
            "::ffff:10.0.0.5 is a private address; webhooks may only go to public addresses.",
        ),
        (
            "https://inside.example.com/hook",
            "inside.example.com resolves to a private address; "
            "webhooks may only go to public addresses.",
        ),
        (
            # One private address among public ones is enough.
            "https://mixed.example.com/hook",
            "mixed.example.com resolves to a loopback address; "
            "webhooks may only go to public addresses.",
        ),
        (
            "https://nowhere.example.com/hook",
            "nowhere.example.com does not resolve; webhooks may only go to public addresses, "
            "so the name must resolve to check it.",
        ),
        # An IPv4 address spelt oddly is a name to the URL parser; the resolver reads it.
        (
            "http://2130706433/",
            "2130706433 resolves to a loopback address; webhooks may only go to public addresses.",
        ),
    ],
)
def test_targets_check_url_refuses_non_public_hosts(refuse_private, dns, url, message):
    dns["inside.example.com"] = ["10.0.0.7"]
    dns["mixed.example.com"] = [PUBLIC, "127.0.0.1"]
    dns["2130706433"] = ["127.0.0.1"]

    with pytest.raises(targets.WebhookURLError) as refused:
        targets.check_url(url)

    assert str(refused.value) == message


def test_targets_check_url_accepts_a_public_address_and_a_public_name(refuse_private, dns):
    dns["hooks.example.com"] = [PUBLIC, "2606:4700:4700::1111"]

    assert targets.check_url(f"https://{PUBLIC}/hook") == f"https://{PUBLIC}/hook"
    assert targets.check_url("https://hooks.example.com/x") == "https://hooks.example.com/x"


def test_targets_check_url_allowing_private_looks_nothing_up(settings, dns):
    settings.NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS = True

    assert targets.check_url("http://127.0.0.1:8025/") == "http://127.0.0.1:8025/"
    # Not even a name that does not resolve: development may name hosts of its own.
    assert targets.check_url("https://nowhere.example.com/") == "https://nowhere.example.com/"
    assert dns.resolved == [] and dns.looked_up == []


def test_targets_create_form_shows_why_a_loopback_url_is_refused(
    client, tenant, admin, refuse_private, dns
):
    client.force_login(admin)

    response = client.post(
        reverse("notifications:webhooks", args=["acme"]),
        {"url": "http://127.0.0.1:8025/", "events": ["ticket.created"]},
    )

    page = response.content.decode()
    assert response.status_code == 400
    assert 'id="url-errors"' in page
    assert "127.0.0.1 is a loopback address; webhooks may only go to public addresses." in page
    assert WebhookEndpoint.objects.count() == 0
    assert not AuditEvent.objects.filter(action="webhook.created").exists()


def test_targets_edit_form_refuses_a_name_that_resolves_to_the_metadata_address(
    client, tenant, admin, settings, dns
):
    dns["hooks.example.com"] = [PUBLIC]
    dns["metadata.example.com"] = ["169.254.169.254"]
    settings.NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS = False
    endpoint, _ = make_endpoint(tenant, admin, url="https://hooks.example.com/hook")
    client.force_login(admin)

    response = client.post(
        reverse("notifications:webhook", args=["acme", endpoint.pk]),
        {"url": "https://metadata.example.com/", "events": ["run.completed"]},
    )

    assert response.status_code == 400
    assert (
        "metadata.example.com resolves to a link-local address; "
        "webhooks may only go to public addresses." in response.content.decode()
    )
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).url == "https://hooks.example.com/hook"


def test_targets_a_webhook_the_guard_now_refuses_can_still_be_switched_off(
    client, tenant, admin, settings, dns
):
    # Saved while private targets were allowed; the guard is on now and the name is private.
    endpoint, _ = make_endpoint(tenant, admin, url="https://inside.example.com/hook")
    dns["inside.example.com"] = ["10.0.0.7"]
    settings.NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS = False
    client.force_login(admin)
    url = reverse("notifications:webhook", args=["acme", endpoint.pk])

    off = client.post(url, {"url": endpoint.url, "events": ["run.completed"], "active": ""})
    moved = client.post(url, {"url": "https://inside.example.com/other", "events": ["run.failed"]})

    endpoint.refresh_from_db()
    assert off.status_code == 302
    assert (endpoint.active, endpoint.events) == (False, ["run.completed"])
    assert dns.resolved == ["inside.example.com"]  # only for the new URL
    assert moved.status_code == 400
    assert "inside.example.com resolves to a private address" in moved.content.decode()
    assert endpoint.url == "https://inside.example.com/hook"


def test_targets_create_endpoint_refuses_without_a_row(tenant, admin, refuse_private, dns):
    with pytest.raises(targets.WebhookURLError, match="is a private address"):
        make_endpoint(tenant, admin, url="http://10.0.0.1/hook")

    assert WebhookEndpoint.objects.count() == 0


# --- at send time -----------------------------------------------------------------------------


def test_targets_the_connection_goes_to_the_resolved_address_with_the_name_as_host(
    tenant, admin, dns, loopback
):
    # Private targets allowed (the tests' default): the name resolves only through _resolve,
    # and socket.getaddrinfo refuses it, so the request arrives only if the connect is pinned.
    dns["hooks.example.test"] = ["127.0.0.1"]
    url = f"http://hooks.example.test:{loopback.port}/hook"
    endpoint, _ = make_endpoint(tenant, admin, url=url)

    delivery = deliveries.attempt(one_delivery(tenant, endpoint).pk)

    assert (delivery.status, delivery.last_status_code, delivery.last_error) == (
        "delivered",
        204,
        "",
    )
    assert loopback.requests == [("/hook", f"hooks.example.test:{loopback.port}")]
    assert dns.looked_up == []


def test_targets_a_name_rebound_to_loopback_after_saving_is_refused_at_send_time(
    tenant, admin, refuse_private, dns, loopback
):
    dns["hooks.example.com"] = [PUBLIC]
    url = f"http://hooks.example.com:{loopback.port}/hook"
    endpoint, _ = make_endpoint(tenant, admin, url=url)
    dns["hooks.example.com"] = ["127.0.0.1"]

    delivery = deliveries.attempt(one_delivery(tenant, endpoint).pk)

    assert loopback.requests == []
    # A failed attempt like any other: retried after the backoff, as DNS may change again.
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("pending", 1, None)
    assert delivery.last_error == "refused: hooks.example.com resolves to a loopback address"
    assert delivery.next_attempt_at is not None


def test_targets_post_refuses_a_loopback_address_in_a_stored_url(refuse_private, dns, loopback):
    outcome = transport.post(f"http://127.0.0.1:{loopback.port}/hook", b"{}", {})

    assert (outcome.ok, outcome.status_code, outcome.error) == (
        False,
        None,
        "refused: 127.0.0.1 is a loopback address",
    )
    assert loopback.requests == []


def test_targets_post_refuses_when_any_address_is_private(refuse_private, dns, loopback):
    dns["hooks.example.com"] = [PUBLIC, "127.0.0.1"]

    outcome = transport.post(f"http://hooks.example.com:{loopback.port}/hook", b"{}", {})

    assert outcome.error == "refused: hooks.example.com resolves to a loopback address"
    assert loopback.requests == []


def test_targets_post_a_name_that_does_not_resolve_cannot_connect(dns):
    outcome = transport.post("https://nowhere.example.com/hook", b"{}", {})

    assert (outcome.ok, outcome.status_code) == (False, None)
    assert outcome.error == (
        "cannot connect: nowhere.example.com does not resolve ([Errno -2] Name or service not known)"
    )
    assert dns.looked_up == []


# --- HTTPS: pinned to the address, verified against the name -----------------------------------


def _certificate(tmp_path, name: str) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_file), str(key_file)


@pytest.fixture
def tls_loopback(tmp_path, monkeypatch):
    """An HTTPS server on 127.0.0.1 whose certificate names hooks.example.test, trusted by the
    client (as the system's CAs would trust a real one) and by nothing else."""
    cert_file, key_file = _certificate(tmp_path, "hooks.example.test")
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert_file, key_file)
    monkeypatch.setattr(
        transport, "_tls_context", lambda: ssl.create_default_context(cafile=cert_file)
    )
    server, thread, hits = _serve(server_context)
    hits.port = server.server_address[1]
    yield hits
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_targets_https_is_pinned_and_sends_the_name_for_sni_and_the_certificate(dns, tls_loopback):
    dns["hooks.example.test"] = ["127.0.0.1"]

    outcome = transport.post(f"https://hooks.example.test:{tls_loopback.port}/hook", b"{}", {})

    assert (outcome.ok, outcome.status_code, outcome.error) == (True, 204, "")
    assert tls_loopback.sni == ["hooks.example.test"]
    assert tls_loopback.requests == [("/hook", f"hooks.example.test:{tls_loopback.port}")]
    assert dns.looked_up == []


def test_targets_https_certificate_is_checked_against_the_name_not_the_address(dns, tls_loopback):
    # Same address, same certificate, another name: the certificate does not name it.
    dns["other.example.test"] = ["127.0.0.1"]

    outcome = transport.post(f"https://other.example.test:{tls_loopback.port}/hook", b"{}", {})

    assert (outcome.ok, outcome.status_code) == (False, None)
    assert "certificate verify failed" in outcome.error
    assert "other.example.test" in outcome.error
    assert tls_loopback.sni == ["other.example.test"]
    assert tls_loopback.requests == []
