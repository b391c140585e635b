"""Production settings pass `check --deploy`, and responses carry the security headers and
Secure, HttpOnly cookies. Production settings are read in a subprocess with
APPROVALS_ENV=production, as a deployment would start them."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher, make_password
from django.urls import reverse

from approvals.middleware import CONSOLE_CSP
from approvals.models import Role
from config.env import new_encryption_key
from tests.conftest import database_url
from tests.support import TenantFactory, member

ROOT = Path(__file__).resolve().parent.parent.parent
HOST = "console.example.com"
# Variables the settings read; the parent's values must not leak into the subprocess.
SETTINGS_VARIABLES = (
    "APPROVALS_ENV",
    "DJANGO_SECRET_KEY",
    "APPROVALS_ENCRYPTION_KEYS",
    "APPROVALS_AUDIT_KEYS",
    "APPROVALS_AUDIT_SIGNING_KEY",
    "APPROVALS_DECISION_SIGNING_KEYS",
    "DJANGO_ALLOWED_HOSTS",
    "DJANGO_DEBUG",
    "DJANGO_SECURE_SSL_REDIRECT",
    "DJANGO_HSTS_SECONDS",
    "DJANGO_CSRF_TRUSTED_ORIGINS",
    "NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS",
    "REDIS_URL",
)
HEADERS = {
    "Content-Security-Policy": CONSOLE_CSP,
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
}


def production_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS_VARIABLES}
    env.update(
        APPROVALS_ENV="production",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(64),
        APPROVALS_ENCRYPTION_KEYS=f"prod1:{new_encryption_key()}",
        APPROVALS_AUDIT_KEYS=f"audit1:{new_encryption_key()}",
        APPROVALS_AUDIT_SIGNING_KEY=new_encryption_key(),
        APPROVALS_DECISION_SIGNING_KEYS=f"decision1:{new_encryption_key()}",
        DJANGO_ALLOWED_HOSTS=HOST,
        APPROVALS_PUBLIC_URL=f"https://{HOST}",
        **extra,
    )
    return env


def python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_deploy_check_is_clean_with_production_settings():
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=production_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == "System check identified no issues (0 silenced).\n"


PRODUCTION_SCRIPT = """
import json, django
django.setup()
from django.conf import settings
from django.test import Client
client = Client(HTTP_HOST="console.example.com", HTTP_X_FORWARDED_PROTO="https")

def cookie(response, name):
    morsel = response.cookies.get(name)
    return None if morsel is None else {
        "secure": bool(morsel["secure"]), "httponly": bool(morsel["httponly"]),
        "samesite": morsel["samesite"],
    }

plain = Client(HTTP_HOST="console.example.com").get("/login/")
page = client.get("/login/")
signed_in = client.post("/login/", {"login": "prod-user", "password": "a long pass phrase 42"})
print(json.dumps({
    "settings": {name: getattr(settings, name) for name in %(settings)r},
    "plain": [plain.status_code, plain.get("Location")],
    "page": [page.status_code, {name: page.get(name) for name in %(headers)r}],
    "hsts": page.get("Strict-Transport-Security"),
    "csrftoken": cookie(page, "csrftoken"),
    "signed_in": [signed_in.status_code, signed_in.get("Location")],
    "sessionid": cookie(signed_in, "sessionid"),
}))
"""


PRODUCTION_SETTINGS = {
    "DEBUG": False,
    "SESSION_COOKIE_SECURE": True,
    "SESSION_COOKIE_HTTPONLY": True,
    "CSRF_COOKIE_SECURE": True,
    "SECURE_SSL_REDIRECT": True,
    "SECURE_HSTS_SECONDS": 31536000,
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
    "SECURE_CONTENT_TYPE_NOSNIFF": True,
    "SECURE_REFERRER_POLICY": "same-origin",
    "X_FRAME_OPTIONS": "DENY",
    "ALLOWED_HOSTS": [HOST],
    "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],
    # Webhooks to private, loopback and link-local addresses are refused (the SSRF guard).
    "NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS": False,
}


# One subprocess for the settings and the responses: starting Django costs seconds.
@pytest.mark.django_db(transaction=True)
def test_deploy_production_settings_headers_and_secure_cookies():
    user = member(TenantFactory(), Role.VIEWER, username="prod-user")
    # The subprocess checks the password with the production hashers, not the tests' MD5.
    user.password = make_password("a long pass phrase 42", hasher=PBKDF2PasswordHasher())
    user.save(update_fields=["password"])
    env = production_env(DJANGO_SETTINGS_MODULE="config.settings", DATABASE_URL=database_url())

    script = PRODUCTION_SCRIPT % {"headers": list(HEADERS), "settings": list(PRODUCTION_SETTINGS)}

    result = python(script, env)

    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["settings"] == PRODUCTION_SETTINGS
    assert seen["plain"] == [301, f"https://{HOST}/login/"]
    assert seen["page"] == [200, HEADERS]
    assert seen["hsts"] == "max-age=31536000; includeSubDomains; preload"
    assert seen["csrftoken"] == {"secure": True, "httponly": False, "samesite": "Lax"}
    assert seen["signed_in"] == [302, "/"]
    assert seen["sessionid"] == {"secure": True, "httponly": True, "samesite": "Lax"}


@pytest.mark.django_db
@pytest.mark.parametrize("htmx", [False, True], ids=["page", "htmx"])
def test_deploy_every_kind_of_response_carries_the_security_headers(client, htmx):
    tenant = TenantFactory()
    client.force_login(member(tenant, Role.ADMIN))
    headers = {"HX-Request": "true", "HX-Target": "queue-rows"} if htmx else {}
    urls = [
        reverse("approvals:queue"),
        reverse("approvals:audit"),
        reverse("approvals:ticket", args=[999999]),
        reverse("approvals:decide", args=[999999]),
        reverse("sessions_admin:list"),
    ]

    seen = {
        url: {name: client.get(url, headers=headers).get(name) for name in HEADERS} for url in urls
    }

    assert seen == dict.fromkeys(urls, HEADERS)


@pytest.mark.django_db
def test_deploy_sign_in_cookies_are_secure_and_httponly_with_production_values(client, settings):
    """In-process, with the cookie settings production has (checked in the subprocess)."""
    settings.SESSION_COOKIE_SECURE = True
    settings.CSRF_COOKIE_SECURE = True
    member(TenantFactory(), Role.VIEWER, username="cookie-user")

    page = client.get(reverse("login"), secure=True)
    response = client.post(
        reverse("login"), {"login": "cookie-user", "password": "test-pass-123"}, secure=True
    )

    assert response.status_code == 302
    session = response.cookies["sessionid"]
    assert (bool(session["secure"]), bool(session["httponly"])) == (True, True)
    assert bool(page.cookies["csrftoken"]["secure"]) is True
