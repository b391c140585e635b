"""A real OpenID Connect provider on loopback, in its own process, for the single sign-on tests.

Run as a program (``python -m tests.accounts.oidc_provider --client-id ID --secret S``) it
serves on 127.0.0.1 at a free port (printed as the first line of stdout, "PORT <n>"):

- ``/.well-known/openid-configuration``: discovery;
- ``/authorize``: the authorization-code flow; it approves the configured user at once (no
  login form) and redirects back with ``code`` and ``state``; PKCE S256 is required when the
  client sends a challenge, and the redirect URI is remembered with the code;
- ``/token``: ``authorization_code`` with ``client_secret_basic`` or ``client_secret_post``,
  PKCE verified; an RS256 id token (iss, aud, sub, exp, iat, nonce and the user's claims);
- ``/jwks``: the public key; ``/userinfo``: the user's claims for the bearer token;
- ``POST /_test/user`` (JSON): the user the next /authorize approves (sub, preferred_username,
  email, groups, any other claim).

The keys and JWTs are authlib's (authlib.jose). Tests use it through the ``oidc_provider``
fixture below (import it into a conftest or test module: ``from tests.accounts.oidc_provider
import oidc_provider, oidc_server  # noqa: F401``). The fixture returns an OidcProvider:

- ``.url`` (the issuer), ``.provider_id`` ("sso"), ``.name`` ("Test IdP");
- ``.set_user(sub=..., preferred_username=..., email=..., groups=[...], **claims)``;
- ``.env()``: the APPROVALS_OIDC_* variables for a console started as a subprocess (the
  browser tests' runserver: pass them to tests.conftest.subprocess_env(**provider.env()));
- in-process, it points settings.SOCIALACCOUNT_PROVIDERS at the provider for the test.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from socketserver import ThreadingMixIn
from urllib.parse import parse_qs, urlencode
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest

CLIENT_ID = "console-test"
CLIENT_SECRET = "console-test-secret"  # noqa: S105  (a test provider's secret)
PROVIDER_ID = "sso"
PROVIDER_NAME = "Test IdP"
ROOT = Path(__file__).resolve().parents[2]


# --- the provider (runs in its own process) ----------------------------------------------------


class _Provider:
    def __init__(self, client_id: str, secret: str) -> None:
        from authlib.jose import JsonWebKey

        self.client_id = client_id
        self.secret = secret
        self.key = JsonWebKey.generate_key("RSA", 2048, is_private=True, options={"kid": "k1"})
        self.issuer = ""
        self.user: dict = {"sub": "u-1", "preferred_username": "sso-user"}
        self.codes: dict[str, dict] = {}
        self.tokens: dict[str, dict] = {}
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        method = environ.get("REQUEST_METHOD", "GET")
        query = {k: v[0] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
        body = b""
        if method == "POST":
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length)
        handler = {
            "/.well-known/openid-configuration": self.discovery,
            "/authorize": self.authorize,
            "/token": self.token,
            "/jwks": self.jwks,
            "/userinfo": self.userinfo,
            "/_test/user": self.set_user,
        }.get(path)
        if handler is None:
            return self._json(start_response, {"error": "not_found"}, HTTPStatus.NOT_FOUND)
        return handler(environ, start_response, query, body)

    def _json(self, start_response, data, status=HTTPStatus.OK, headers=()):
        payload = json.dumps(data).encode()
        start_response(
            f"{status.value} {status.phrase}",
            [("Content-Type", "application/json"), ("Cache-Control", "no-store"), *headers],
        )
        return [payload]

    def discovery(self, environ, start_response, query, body):
        base = self.issuer
        return self._json(
            start_response,
            {
                "issuer": base,
                "authorization_endpoint": f"{base}/authorize",
                "token_endpoint": f"{base}/token",
                "userinfo_endpoint": f"{base}/userinfo",
                "jwks_uri": f"{base}/jwks",
                "response_types_supported": ["code"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256"],
                "token_endpoint_auth_methods_supported": [
                    "client_secret_basic",
                    "client_secret_post",
                ],
                "code_challenge_methods_supported": ["S256"],
                "scopes_supported": ["openid", "profile", "email", "groups"],
            },
        )

    def authorize(self, environ, start_response, query, body):
        if query.get("client_id") != self.client_id or query.get("response_type") != "code":
            return self._json(start_response, {"error": "invalid_request"}, HTTPStatus.BAD_REQUEST)
        redirect_uri = query.get("redirect_uri", "")
        if not redirect_uri.startswith(
            ("http://127.0.0.1", "http://localhost", "http://testserver")
        ):
            return self._json(
                start_response, {"error": "invalid_redirect_uri"}, HTTPStatus.BAD_REQUEST
            )
        challenge = query.get("code_challenge", "")
        if challenge and query.get("code_challenge_method") != "S256":
            return self._json(start_response, {"error": "invalid_request"}, HTTPStatus.BAD_REQUEST)
        code = secrets.token_urlsafe(24)
        with self.lock:
            self.codes[code] = {
                "redirect_uri": redirect_uri,
                "challenge": challenge,
                "nonce": query.get("nonce", ""),
                "user": dict(self.user),
                "at": time.time(),
            }
        params = {"code": code}
        if "state" in query:
            params["state"] = query["state"]
        separator = "&" if "?" in redirect_uri else "?"
        start_response("302 Found", [("Location", f"{redirect_uri}{separator}{urlencode(params)}")])
        return [b""]

    def _client_ok(self, environ, form) -> bool:
        auth = environ.get("HTTP_AUTHORIZATION", "")
        if auth.startswith("Basic "):
            from urllib.parse import unquote

            client_id, _, secret = base64.b64decode(auth[6:]).decode().partition(":")
            client_id, secret = unquote(client_id), unquote(secret)
        else:
            client_id, secret = form.get("client_id", ""), form.get("client_secret", "")
        return client_id == self.client_id and secrets.compare_digest(secret, self.secret)

    def token(self, environ, start_response, query, body):
        from authlib.jose import jwt

        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        if not self._client_ok(environ, form):
            return self._json(start_response, {"error": "invalid_client"}, HTTPStatus.UNAUTHORIZED)
        if form.get("grant_type") != "authorization_code":
            return self._json(
                start_response, {"error": "unsupported_grant_type"}, HTTPStatus.BAD_REQUEST
            )
        with self.lock:
            grant = self.codes.pop(form.get("code", ""), None)
        if grant is None or time.time() - grant["at"] > 60:
            return self._json(start_response, {"error": "invalid_grant"}, HTTPStatus.BAD_REQUEST)
        if form.get("redirect_uri", grant["redirect_uri"]) != grant["redirect_uri"]:
            return self._json(start_response, {"error": "invalid_grant"}, HTTPStatus.BAD_REQUEST)
        if grant["challenge"]:
            verifier = form.get("code_verifier", "")
            digest = hashlib.sha256(verifier.encode()).digest()
            computed = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
            if not verifier or computed != grant["challenge"]:
                return self._json(
                    start_response, {"error": "invalid_grant"}, HTTPStatus.BAD_REQUEST
                )
        user = grant["user"]
        now = int(time.time())
        claims = {
            **user,
            "iss": self.issuer,
            "aud": self.client_id,
            "iat": now,
            "exp": now + 300,
        }
        if grant["nonce"]:
            claims["nonce"] = grant["nonce"]
        id_token = jwt.encode({"alg": "RS256", "kid": "k1"}, claims, self.key).decode()
        access = secrets.token_urlsafe(24)
        with self.lock:
            self.tokens[access] = user
        return self._json(
            start_response,
            {
                "access_token": access,
                "token_type": "Bearer",
                "expires_in": 300,
                "id_token": id_token,
                "scope": "openid profile email",
            },
        )

    def jwks(self, environ, start_response, query, body):
        return self._json(start_response, {"keys": [self.key.as_dict(is_private=False)]})

    def userinfo(self, environ, start_response, query, body):
        auth = environ.get("HTTP_AUTHORIZATION", "")
        user = self.tokens.get(auth[7:]) if auth.startswith("Bearer ") else None
        if user is None:
            return self._json(
                start_response,
                {"error": "invalid_token"},
                HTTPStatus.UNAUTHORIZED,
                headers=[("WWW-Authenticate", 'Bearer error="invalid_token"')],
            )
        return self._json(start_response, user)

    def set_user(self, environ, start_response, query, body):
        user = json.loads(body or b"{}")
        if not isinstance(user, dict) or not user.get("sub"):
            return self._json(start_response, {"error": "sub needed"}, HTTPStatus.BAD_REQUEST)
        with self.lock:
            self.user = user
        return self._json(start_response, {"ok": True})


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args) -> None:
        pass


def main(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client-id", default=CLIENT_ID)
    parser.add_argument("--secret", default=CLIENT_SECRET)
    args = parser.parse_args(argv)
    app = _Provider(args.client_id, args.secret)
    server = make_server("127.0.0.1", 0, app, server_class=_Server, handler_class=_QuietHandler)
    port = server.server_address[1]
    app.issuer = f"http://127.0.0.1:{port}"
    print(f"PORT {port}", flush=True)
    server.serve_forever()


# --- the tests' side ---------------------------------------------------------------------------


@dataclass
class OidcProvider:
    url: str
    process: subprocess.Popen
    provider_id: str = PROVIDER_ID
    name: str = PROVIDER_NAME
    client_id: str = CLIENT_ID
    secret: str = CLIENT_SECRET
    groups_claim: str = "groups"
    user: dict = field(default_factory=dict)

    def set_user(self, *, sub: str, **claims) -> dict:
        """The person the provider approves at the next /authorize."""
        import requests

        user = {"sub": sub, **claims}
        response = requests.post(f"{self.url}/_test/user", json=user, timeout=5)
        response.raise_for_status()
        self.user = user
        return user

    def app(self) -> dict:
        """This provider as one of config.env.oidc_providers' entries."""
        from config.env import _oidc_provider

        return _oidc_provider(
            {
                "id": self.provider_id,
                "name": self.name,
                "issuer": self.url,
                "client_id": self.client_id,
                "secret": self.secret,
                "groups_claim": self.groups_claim,
            },
            "test provider",
        )

    def env(self) -> dict[str, str]:
        """The environment a console subprocess needs to sign in through this provider."""
        return {
            "APPROVALS_OIDC_ID": self.provider_id,
            "APPROVALS_OIDC_NAME": self.name,
            "APPROVALS_OIDC_ISSUER": self.url,
            "APPROVALS_OIDC_CLIENT_ID": self.client_id,
            "APPROVALS_OIDC_CLIENT_SECRET": self.secret,
            "APPROVALS_OIDC_GROUPS_CLAIM": self.groups_claim,
        }


def start_provider() -> OidcProvider:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.accounts.oidc_provider"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline() if process.stdout else ""
    if not line.startswith("PORT "):
        process.kill()
        _, err = process.communicate(timeout=10)
        raise RuntimeError(f"the test OpenID Connect provider did not start: {line!r} {err}")
    return OidcProvider(url=f"http://127.0.0.1:{int(line.split()[1])}", process=process)


@pytest.fixture(scope="session")
def oidc_server():
    """The provider's process, one for the test session."""
    provider = start_provider()
    yield provider
    provider.process.kill()
    provider.process.communicate(timeout=10)


@pytest.fixture
def oidc_provider(oidc_server, settings):
    """The provider, configured as the console's only OpenID Connect provider for this test,
    with a default user (sub "u-1", preferred_username "sso-user", no groups)."""
    settings.SOCIALACCOUNT_PROVIDERS = {"openid_connect": {"APPS": [oidc_server.app()]}}
    oidc_server.set_user(sub="u-1", preferred_username="sso-user", email="sso-user@example.com")
    return oidc_server


if __name__ == "__main__":
    main(sys.argv[1:])
