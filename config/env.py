"""Typed readers for settings that come from the environment.

Each reader raises ImproperlyConfigured with one line that names the variable and says what is
wrong, so that a bad value stops start-up clearly.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import secrets
import sys
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

_KEY_ID = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no)")


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a whole number") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name}={value} must be at least {minimum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [part.strip() for part in raw.split(",") if part.strip()]


def env_url(name: str, default: str) -> str:
    """An absolute http(s) URL without a trailing slash, e.g. the console's public address."""
    raw = os.environ.get(name) or default
    parts = urlsplit(raw)
    if parts.scheme not in {"http", "https"} or not parts.netloc or parts.query or parts.fragment:
        raise ImproperlyConfigured(
            f"{name}={raw!r} must be an http:// or https:// URL without a query or fragment"
        )
    return raw.rstrip("/")


def development_public_url(*, host: str, port: int) -> str:
    """Where a development server bound to host:port is reached: a bind-all address (0.0.0.0,
    ::) is no address to link to, so links name the loopback one."""
    host = host.strip().strip("[]")
    if host in {"", "0.0.0.0", "::"}:
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


# psycopg prepares a statement the second time a connection runs it; Django's default (None)
# never does. See database_from_url.
PREPARE_THRESHOLD = 1


def database_from_url(
    url: str, *, base_dir: Path, pool_size: int = 0, prepared_statements: bool = True
) -> dict:
    """DATABASES entry for a postgres:// or sqlite:/// URL (parsed by dj-database-url).

    pool_size > 0 gives each process a pool of at most that many PostgreSQL connections
    (psycopg_pool, checked before each use), so a request, a task or a tool thread borrows an
    open connection instead of opening one (several milliseconds each).

    prepared_statements (PostgreSQL): parameters bound by the server, and a statement a
    connection has run before prepared (psycopg's prepare_threshold): parsed once, and planned
    once when PostgreSQL finds one plan for every value as good (the hot path's reads and
    updates by key), else planned with each call's values. Planning the console's queries
    costs the server more than running them (a ticket read with its run: 0.27 ms to plan, 0.06
    ms to run); a pooled connection keeps its prepared statements for every request that
    borrows it. Off behind a PgBouncer in transaction mode older than 1.21, which cannot carry
    prepared statements.
    """
    scheme = urlsplit(url).scheme
    if scheme not in {"postgres", "postgresql", "pgsql", "sqlite"}:
        raise ImproperlyConfigured(
            f"DATABASE_URL scheme {scheme!r} is not supported (use postgres:// or sqlite:///)"
        )
    config = dj_database_url.parse(url, conn_max_age=0)
    if scheme == "sqlite":
        path = config["NAME"]
        # dj-database-url reads "sqlite:///" as an in-memory database, which no worker can share.
        if not path or path in {"/", ":memory:"}:
            raise ImproperlyConfigured("DATABASE_URL names no SQLite file (sqlite:///path.db)")
        file = Path(path) if Path(path).is_absolute() else base_dir / path
        return sqlite_database(file)
    if not config["NAME"]:
        raise ImproperlyConfigured("DATABASE_URL names no database (postgres://user@host/NAME)")
    options = config.setdefault("OPTIONS", {})
    if prepared_statements:
        options.update(server_side_binding=True, prepare_threshold=PREPARE_THRESHOLD)
    if pool_size > 0:
        options["pool"] = {"min_size": min(2, pool_size), "max_size": pool_size, "timeout": 10}
    config.update(
        PORT=str(config["PORT"] or ""),
        CONN_HEALTH_CHECKS=pool_size > 0,
        TEST={"NAME": f"test_{config['NAME']}"},
    )
    return config


def sqlite_database(file: Path) -> dict:
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(file),
        # IMMEDIATE takes the write lock at BEGIN, so writers queue instead of failing mid-way.
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30},
        # A file, not :memory:, so that worker processes started by tests share it.
        "TEST": {"NAME": str(file.with_name(f".test-{file.name}"))},
    }


def parse_encryption_keys(
    raw: str, *, name: str = "APPROVALS_ENCRYPTION_KEYS", algorithm: str = "AES-256"
) -> list[tuple[str, bytes]]:
    """Parse a key ring 'id:base64key,id2:base64key2' of 32-byte keys; the first is the primary.

    The one parser of the console's key rings: APPROVALS_ENCRYPTION_KEYS (AES-256) and
    APPROVALS_AUDIT_KEYS (HMAC-SHA256); name and algorithm only word its errors.
    """
    keys: list[tuple[str, bytes]] = []
    for entry in raw.split(","):
        entry = entry.strip()
        if not entry:
            continue
        key_id, sep, encoded = entry.partition(":")
        if not sep or not _KEY_ID.match(key_id):
            raise ImproperlyConfigured(
                f"{name} must be 'keyid:base64key[,keyid:base64key]' "
                "with key ids of letters, digits, '.', '_' or '-'"
            )
        key = _decode_key(encoded, f"{name}: key {key_id!r}")
        if len(key) != 32:
            raise ImproperlyConfigured(
                f"{name}: key {key_id!r} is {len(key)} bytes, {algorithm} needs 32"
            )
        if any(existing == key_id for existing, _ in keys):
            raise ImproperlyConfigured(f"{name}: key id {key_id!r} repeats")
        keys.append((key_id, key))
    if not keys:
        raise ImproperlyConfigured(f"{name} holds no key")
    return keys


def parse_signing_key(raw: str, *, name: str = "APPROVALS_AUDIT_SIGNING_KEY") -> bytes:
    """A base64 raw Ed25519 private key (32 bytes; any 32 bytes are one)."""
    key = _decode_key(raw.strip(), name)
    if len(key) != 32:
        raise ImproperlyConfigured(
            f"{name} is {len(key)} bytes, an Ed25519 private key is 32 (base64 of the raw key)"
        )
    return key


def _decode_key(encoded: str, what: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except (binascii.Error, ValueError):
        raise ImproperlyConfigured(f"{what} is not valid base64") from None


def new_encryption_key() -> str:
    """32 random bytes in base64: an AES-256 key, an HMAC-SHA256 key or an Ed25519 private key."""
    return base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")


# The secrets development generates into .dev-keys.env and production requires from the
# environment (config.settings).
DEV_SECRETS = (
    "DJANGO_SECRET_KEY",
    "APPROVALS_ENCRYPTION_KEYS",
    "APPROVALS_AUDIT_KEYS",
    "APPROVALS_AUDIT_SIGNING_KEY",
    "APPROVALS_DECISION_SIGNING_KEYS",
)


def _new_dev_secret(name: str) -> str:
    if name == "DJANGO_SECRET_KEY":
        return secrets.token_urlsafe(50)
    if name == "APPROVALS_AUDIT_SIGNING_KEY":
        return new_encryption_key()
    return f"dev1:{new_encryption_key()}"


def load_dev_secrets(path: Path) -> dict[str, str]:
    """Read, or create with a warning, the git-ignored file of development secrets.

    A file written before a secret was added gets the missing one appended, with the same
    warning; the ones it holds are kept.
    """
    values = {}
    text = path.read_text() if path.exists() else ""
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    missing = {name: _new_dev_secret(name) for name in DEV_SECRETS if not values.get(name)}
    if missing:
        lines = "".join(f"{k}={v}\n" for k, v in missing.items())
        path.write_text(text + ("\n" if text and not text.endswith("\n") else "") + lines)
        path.chmod(0o600)
        print(
            f"WARNING: generated development secrets in {path.name} (git-ignored): "
            f"{', '.join(missing)}. Set {', '.join(DEV_SECRETS)} for any real deployment.",
            file=sys.stderr,
        )
        values |= missing
    return values


_PROVIDER_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,29}$")


def _authorize_origin(raw: dict, where: str) -> dict:
    """An authorization endpoint on another origin than the issuer (rare): "authorize_origin"
    in APPROVALS_OIDC_PROVIDERS, or APPROVALS_OIDC_AUTHORIZE_ORIGIN."""
    origin = str(raw.get("authorize_origin") or "").rstrip("/")
    if not origin:
        return {}
    parts = urlsplit(origin)
    if parts.scheme not in {"http", "https"} or not parts.netloc or parts.path:
        raise ImproperlyConfigured(f"{where}: authorize_origin {origin!r} is not scheme://host")
    return {"authorize_origin": origin}


def _oidc_provider(raw: dict, where: str) -> dict:
    """One OpenID Connect provider as allauth's openid_connect app: issuer, client id, secret."""
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(f"{where} must be an object with issuer, client_id, secret")
    missing = [key for key in ("issuer", "client_id", "secret") if not raw.get(key)]
    if missing:
        raise ImproperlyConfigured(f"{where} needs {', '.join(missing)}")
    provider_id = str(raw.get("id") or "sso")
    if not _PROVIDER_ID.match(provider_id):
        raise ImproperlyConfigured(
            f"{where}: id {provider_id!r} must be lower-case letters, digits and dashes"
        )
    issuer = str(raw["issuer"]).rstrip("/")
    parts = urlsplit(issuer)
    if parts.scheme not in {"http", "https"} or not parts.netloc:
        raise ImproperlyConfigured(f"{where}: issuer {issuer!r} is not an http(s) URL")
    scopes = raw.get("scopes") or ["openid", "profile", "email"]
    if isinstance(scopes, str):
        scopes = scopes.split()
    return {
        "provider_id": provider_id,
        "name": str(raw.get("name") or "Single sign-on"),
        "client_id": str(raw["client_id"]),
        "secret": str(raw["secret"]),
        "settings": {
            "server_url": issuer,
            "oauth_pkce_enabled": True,
            "scope": list(scopes),
            # The claim whose values map to tenant roles (accounts.sso).
            "groups_claim": str(raw.get("groups_claim") or "groups"),
            **_authorize_origin(raw, where),
        },
    }


def oidc_origin(app: dict) -> str:
    """The origin (scheme://host[:port]) of a provider's issuer, where its sign-in page is;
    the setting "authorize_origin" names another one (an authorization endpoint elsewhere)."""
    settings = app.get("settings") or {}
    if settings.get("authorize_origin"):
        return str(settings["authorize_origin"])
    parts = urlsplit(settings.get("server_url", ""))
    return f"{parts.scheme}://{parts.netloc}"


def oidc_providers() -> list[dict]:
    """The OpenID Connect providers people may sign in with.

    One provider: APPROVALS_OIDC_ISSUER, APPROVALS_OIDC_CLIENT_ID, APPROVALS_OIDC_CLIENT_SECRET
    (and optionally APPROVALS_OIDC_ID, _NAME, _SCOPES, _GROUPS_CLAIM). Several:
    APPROVALS_OIDC_PROVIDERS, a JSON list of objects with id, name, issuer, client_id, secret,
    scopes and groups_claim. None set: no single sign-on.
    """
    import json

    providers: list[dict] = []
    listed = os.environ.get("APPROVALS_OIDC_PROVIDERS", "").strip()
    if listed:
        try:
            entries = json.loads(listed)
        except ValueError as error:
            raise ImproperlyConfigured(f"APPROVALS_OIDC_PROVIDERS is not JSON: {error}") from None
        if not isinstance(entries, list):
            raise ImproperlyConfigured("APPROVALS_OIDC_PROVIDERS must be a JSON list of objects")
        providers = [
            _oidc_provider(entry, f"APPROVALS_OIDC_PROVIDERS[{index}]")
            for index, entry in enumerate(entries)
        ]
    single = {
        "id": os.environ.get("APPROVALS_OIDC_ID", ""),
        "name": os.environ.get("APPROVALS_OIDC_NAME", ""),
        "issuer": os.environ.get("APPROVALS_OIDC_ISSUER", ""),
        "client_id": os.environ.get("APPROVALS_OIDC_CLIENT_ID", ""),
        "secret": os.environ.get("APPROVALS_OIDC_CLIENT_SECRET", ""),
        "scopes": os.environ.get("APPROVALS_OIDC_SCOPES", ""),
        "groups_claim": os.environ.get("APPROVALS_OIDC_GROUPS_CLAIM", ""),
        "authorize_origin": os.environ.get("APPROVALS_OIDC_AUTHORIZE_ORIGIN", ""),
    }
    if any(single[key] for key in ("issuer", "client_id", "secret")):
        providers.append(_oidc_provider(single, "APPROVALS_OIDC_ISSUER/_CLIENT_ID/_CLIENT_SECRET"))
    ids = [provider["provider_id"] for provider in providers]
    if len(ids) != len(set(ids)):
        raise ImproperlyConfigured(f"OpenID Connect provider ids repeat: {', '.join(ids)}")
    return providers
