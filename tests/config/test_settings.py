"""Settings from the environment: a bad value stops start-up with one clear line."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.env import (
    DEV_SECRETS,
    database_from_url,
    load_dev_secrets,
    new_encryption_key,
    parse_encryption_keys,
    parse_signing_key,
)
from tests.support import SETTINGS_VARIABLES

ROOT = Path(__file__).resolve().parent.parent.parent
BASE = Path("/srv/console")
KEY_A = base64.urlsafe_b64encode(b"a" * 32).decode()
KEY_B = base64.urlsafe_b64encode(b"b" * 32).decode()
KEY_C = base64.urlsafe_b64encode(b"c" * 32).decode()


def _manage_check(**overrides: str | None) -> subprocess.CompletedProcess:
    return _manage("check", **overrides)


def _manage(*command: str, **overrides: str | None) -> subprocess.CompletedProcess:
    """manage.py with these arguments, in an environment with every setting good but the
    overrides (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS_VARIABLES}
    # Every secret set, so that development settings never write .dev-keys.env.
    env.update(
        DATABASE_URL="sqlite:///var/helper-c-settings.sqlite3",
        DJANGO_SECRET_KEY="test-secret-key-for-settings-tests",
        APPROVALS_ENCRYPTION_KEYS=f"k1:{KEY_A}",
        APPROVALS_AUDIT_KEYS=f"a1:{KEY_B}",
        APPROVALS_AUDIT_SIGNING_KEY=KEY_C,
        APPROVALS_DECISION_SIGNING_KEYS=f"d1:{KEY_A}",
    )
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return subprocess.run(
        [sys.executable, "manage.py", *command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# --- manage.py with a bad environment -------------------------------------------------------


def test_manage_check_good_environment_passes():
    result = _manage_check()

    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == "System check identified no issues (0 silenced).\n"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"DATABASE_URL": "mysql://x"},
            "DATABASE_URL scheme 'mysql' is not supported (use postgres:// or sqlite:///)",
        ),
        (
            {"APPROVALS_ENCRYPTION_KEYS": "k1:short"},
            "APPROVALS_ENCRYPTION_KEYS: key 'k1' is not valid base64",
        ),
        (
            {"APPROVALS_ENCRYPTION_KEYS": "k1:" + base64.urlsafe_b64encode(b"x" * 16).decode()},
            "APPROVALS_ENCRYPTION_KEYS: key 'k1' is 16 bytes, AES-256 needs 32",
        ),
        (
            {"APPROVALS_ENCRYPTION_KEYS": "bad"},
            "APPROVALS_ENCRYPTION_KEYS must be 'keyid:base64key[,keyid:base64key]' "
            "with key ids of letters, digits, '.', '_' or '-'",
        ),
        (
            {"DJANGO_DEBUG": "maybe"},
            "DJANGO_DEBUG='maybe' is not a boolean (use 1/0, true/false, yes/no)",
        ),
        (
            {"NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS": "sometimes"},
            "NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS='sometimes' is not a boolean "
            "(use 1/0, true/false, yes/no)",
        ),
        (
            {"APPROVALS_ENV": "production", "DJANGO_SECRET_KEY": None},
            "DJANGO_SECRET_KEY must be set when APPROVALS_ENV=production",
        ),
        (
            {"APPROVALS_ENV": "production", "APPROVALS_AUDIT_KEYS": None},
            "APPROVALS_AUDIT_KEYS must be set when APPROVALS_ENV=production",
        ),
        (
            {"APPROVALS_ENV": "production", "APPROVALS_AUDIT_SIGNING_KEY": None},
            "APPROVALS_AUDIT_SIGNING_KEY must be set when APPROVALS_ENV=production",
        ),
        (
            {"APPROVALS_AUDIT_KEYS": "a1:" + base64.urlsafe_b64encode(b"x" * 16).decode()},
            "APPROVALS_AUDIT_KEYS: key 'a1' is 16 bytes, HMAC-SHA256 needs 32",
        ),
        (
            {"APPROVALS_AUDIT_SIGNING_KEY": base64.urlsafe_b64encode(b"x" * 64).decode()},
            "APPROVALS_AUDIT_SIGNING_KEY is 64 bytes, an Ed25519 private key is 32 "
            "(base64 of the raw key)",
        ),
        (
            {"APPROVALS_ENV": "production", "APPROVALS_DECISION_SIGNING_KEYS": None},
            "APPROVALS_DECISION_SIGNING_KEYS must be set when APPROVALS_ENV=production",
        ),
        (
            {"APPROVALS_DECISION_SIGNING_KEYS": "d1:" + base64.urlsafe_b64encode(b"x").decode()},
            "APPROVALS_DECISION_SIGNING_KEYS: key 'd1' is 1 bytes, Ed25519 needs 32",
        ),
        (
            {"APPROVALS_ENV": "production", "DJANGO_ALLOWED_HOSTS": "console.example.com"},
            "APPROVALS_PUBLIC_URL must be set when APPROVALS_ENV=production",
        ),
        (
            {"APPROVALS_ENV": "staging"},
            "APPROVALS_ENV='staging' must be 'development' or 'production'",
        ),
    ],
    ids=[
        "mysql-url",
        "key-not-base64",
        "key-too-short",
        "keys-without-id",
        "debug-not-boolean",
        "private-webhooks-not-boolean",
        "production-without-secret-key",
        "production-without-audit-keys",
        "production-without-audit-signing-key",
        "audit-key-too-short",
        "signing-key-wrong-length",
        "production-without-decision-keys",
        "decision-key-wrong-length",
        "production-without-public-url",
        "unknown-env",
    ],
)
def test_manage_check_bad_environment_exits_2_with_one_line(overrides, message):
    result = _manage_check(**overrides)

    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"configuration error: {message}"]
    assert result.stdout == ""


def _setting(name: str, **overrides: str) -> str:
    """The repr of one setting as a process started with this environment sees it."""
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS_VARIABLES}
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DATABASE_URL="sqlite:///var/helper-c-settings.sqlite3",
        DJANGO_SECRET_KEY="test-secret-key-for-settings-tests",
        APPROVALS_ENCRYPTION_KEYS=f"k1:{KEY_A}",
        APPROVALS_AUDIT_KEYS=f"a1:{KEY_B}",
        APPROVALS_AUDIT_SIGNING_KEY=KEY_C,
        APPROVALS_DECISION_SIGNING_KEYS=f"d1:{KEY_A}",
        DJANGO_ALLOWED_HOSTS="console.example.com",
        **overrides,
    )
    code = f"from django.conf import settings; print(repr(settings.{name}))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_private_webhooks_are_allowed_in_development_refused_in_production_unless_set():
    name = "NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS"
    production = {"APPROVALS_ENV": "production", "APPROVALS_PUBLIC_URL": "https://c.example.com"}

    assert [
        _setting(name),
        _setting(name, **production),
        _setting(name, **production, NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS="1"),
        _setting(name, NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS="no"),
    ] == ["True", "False", "True", "False"]


def test_public_url_in_development_follows_port_and_host_unless_set():
    name = "APPROVALS_PUBLIC_URL"

    assert [
        _setting(name),
        _setting(name, PORT="8100"),
        _setting(name, PORT="8100", HOST="localhost"),
        # A bind-all address is no address to link to.
        _setting(name, PORT="8100", HOST="0.0.0.0"),
        _setting(name, PORT="8100", HOST="::1"),
        _setting(name, PORT="8100", APPROVALS_PUBLIC_URL="https://console.example.com/approvals/"),
    ] == [
        "'http://127.0.0.1:8000'",
        "'http://127.0.0.1:8100'",
        "'http://localhost:8100'",
        "'http://127.0.0.1:8100'",
        "'http://[::1]:8100'",
        "'https://console.example.com/approvals'",
    ]


def test_public_url_in_production_is_what_it_says_whatever_port_says():
    assert (
        _setting(
            "APPROVALS_PUBLIC_URL",
            APPROVALS_ENV="production",
            APPROVALS_PUBLIC_URL="https://console.example.com",
            PORT="8100",
        )
        == "'https://console.example.com'"
    )


# --- database_from_url ----------------------------------------------------------------------


def test_database_from_url_postgres_full_url():
    url = "postgres://app:p%40ss@db.example.com:6543/approvals?sslmode=require"

    assert database_from_url(url, base_dir=BASE) == {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "approvals",
        "USER": "app",
        "PASSWORD": "p@ss",
        "HOST": "db.example.com",
        "PORT": "6543",
        "CONN_MAX_AGE": 0,
        "CONN_HEALTH_CHECKS": False,
        "DISABLE_SERVER_SIDE_CURSORS": False,
        "OPTIONS": {"sslmode": "require", "server_side_binding": True, "prepare_threshold": 1},
        "TEST": {"NAME": "test_approvals"},
    }


def test_database_from_url_postgres_without_prepared_statements_leaves_djangos_defaults():
    config = database_from_url(
        "postgres://postgres@127.0.0.1/approvals", base_dir=BASE, prepared_statements=False
    )

    # Django then binds on the client and never prepares (prepare_threshold None).
    assert config["OPTIONS"] == {}


def test_database_from_url_sqlite_has_nothing_to_prepare():
    config = database_from_url("sqlite:///var/console.sqlite3", base_dir=BASE)

    assert "server_side_binding" not in config["OPTIONS"]
    assert "prepare_threshold" not in config["OPTIONS"]


@pytest.mark.parametrize(("value", "expected"), [(None, (True, 1)), ("0", (None, None))])
def test_database_prepared_statements_variable_turns_them_off(value, expected):
    code = (
        "from django.conf import settings; o = settings.DATABASES['default']['OPTIONS']; "
        "print(o.get('server_side_binding'), o.get('prepare_threshold'))"
    )
    result = _manage(
        "shell",
        "-c",
        code,
        DATABASE_URL="postgres://postgres@127.0.0.1:5432/approvals",
        DATABASE_PREPARED_STATEMENTS=value,
    )

    assert (result.returncode, result.stderr) == (0, "")
    # The last line: Django's shell first says what it imported.
    assert result.stdout.splitlines()[-1].split() == [str(v) for v in expected]


def test_database_from_url_with_a_pool_size_pools_checked_connections():
    config = database_from_url(
        "postgres://postgres@127.0.0.1/approvals", base_dir=BASE, pool_size=5
    )

    assert config["OPTIONS"]["pool"] == {"min_size": 2, "max_size": 5, "timeout": 10}
    # Django checks a pooled connection before lending it only with health checks on.
    assert config["CONN_HEALTH_CHECKS"] is True
    assert config["CONN_MAX_AGE"] == 0


def test_database_from_url_sqlite_ignores_the_pool_size():
    config = database_from_url("sqlite:///var/console.sqlite3", base_dir=BASE, pool_size=5)

    assert "pool" not in config["OPTIONS"]


@pytest.mark.parametrize("scheme", ["postgres", "postgresql", "pgsql"])
def test_database_from_url_postgres_minimal_url(scheme):
    config = database_from_url(f"{scheme}://postgres@127.0.0.1/approvals_c", base_dir=BASE)

    assert (config["ENGINE"], config["NAME"], config["USER"], config["PASSWORD"]) == (
        "django.db.backends.postgresql",
        "approvals_c",
        "postgres",
        "",
    )
    assert (config["HOST"], config["PORT"]) == ("127.0.0.1", "")
    assert config["OPTIONS"] == {"server_side_binding": True, "prepare_threshold": 1}


def test_database_from_url_postgres_without_a_name_is_refused():
    with pytest.raises(ImproperlyConfigured) as excinfo:
        database_from_url("postgres://postgres@127.0.0.1:5432/", base_dir=BASE)

    assert str(excinfo.value) == "DATABASE_URL names no database (postgres://user@host/NAME)"


def test_database_from_url_sqlite_relative_path_is_under_base_dir():
    config = database_from_url("sqlite:///var/console.sqlite3", base_dir=BASE)

    assert config == {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": "/srv/console/var/console.sqlite3",
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30},
        "TEST": {"NAME": "/srv/console/var/.test-console.sqlite3"},
    }


def test_database_from_url_sqlite_absolute_path_is_kept():
    config = database_from_url("sqlite:////tmp/approvals/db.sqlite3", base_dir=BASE)

    assert (config["NAME"], config["TEST"]["NAME"]) == (
        "/tmp/approvals/db.sqlite3",
        "/tmp/approvals/.test-db.sqlite3",
    )


def test_database_from_url_sqlite_without_a_path_is_refused():
    with pytest.raises(ImproperlyConfigured) as excinfo:
        database_from_url("sqlite:///", base_dir=BASE)

    assert str(excinfo.value) == "DATABASE_URL names no SQLite file (sqlite:///path.db)"


def test_database_from_url_other_scheme_is_refused():
    with pytest.raises(ImproperlyConfigured) as excinfo:
        database_from_url("mysql://root@localhost/app", base_dir=BASE)

    assert str(excinfo.value) == (
        "DATABASE_URL scheme 'mysql' is not supported (use postgres:// or sqlite:///)"
    )


# --- parse_encryption_keys ------------------------------------------------------------------


def test_parse_encryption_keys_first_key_is_primary():
    keys = parse_encryption_keys(f"k2:{KEY_B}, k1:{KEY_A}")

    assert keys == [("k2", b"b" * 32), ("k1", b"a" * 32)]


def test_parse_encryption_keys_accepts_keys_without_padding():
    encoded = new_encryption_key()

    keys = parse_encryption_keys(f"dev1:{encoded}")

    assert encoded.endswith("=") is False
    assert [(key_id, len(key)) for key_id, key in keys] == [("dev1", 32)]


def test_parse_encryption_keys_duplicate_id_is_refused():
    with pytest.raises(ImproperlyConfigured) as excinfo:
        parse_encryption_keys(f"k1:{KEY_A},k1:{KEY_B}")

    assert str(excinfo.value) == "APPROVALS_ENCRYPTION_KEYS: key id 'k1' repeats"


@pytest.mark.parametrize("raw", ["", " , ,"])
def test_parse_encryption_keys_empty_is_refused(raw):
    with pytest.raises(ImproperlyConfigured) as excinfo:
        parse_encryption_keys(raw)

    assert str(excinfo.value) == "APPROVALS_ENCRYPTION_KEYS holds no key"


def test_parse_encryption_keys_bad_key_id_is_refused():
    with pytest.raises(ImproperlyConfigured) as excinfo:
        parse_encryption_keys(f"key one:{KEY_A}")

    assert str(excinfo.value).startswith("APPROVALS_ENCRYPTION_KEYS must be 'keyid:base64key")


def test_parse_encryption_keys_names_the_audit_ring_in_its_errors():
    with pytest.raises(ImproperlyConfigured) as excinfo:
        parse_encryption_keys(f"a1:{KEY_A},a1:{KEY_B}", name="APPROVALS_AUDIT_KEYS")

    assert str(excinfo.value) == "APPROVALS_AUDIT_KEYS: key id 'a1' repeats"


# --- parse_signing_key ----------------------------------------------------------------------


def test_parse_signing_key_is_the_raw_32_bytes():
    assert parse_signing_key(KEY_C) == b"c" * 32


def test_parse_signing_key_not_base64_is_refused():
    with pytest.raises(ImproperlyConfigured) as excinfo:
        parse_signing_key("not*base64")

    assert str(excinfo.value) == "APPROVALS_AUDIT_SIGNING_KEY is not valid base64"


# --- load_dev_secrets -----------------------------------------------------------------------


def test_load_dev_secrets_creates_every_secret_once(tmp_path, capsys):
    path = tmp_path / ".dev-keys.env"

    first = load_dev_secrets(path)
    again = load_dev_secrets(path)

    assert list(first) == list(DEV_SECRETS)
    assert DEV_SECRETS == (
        "DJANGO_SECRET_KEY",
        "APPROVALS_ENCRYPTION_KEYS",
        "APPROVALS_AUDIT_KEYS",
        "APPROVALS_AUDIT_SIGNING_KEY",
        "APPROVALS_DECISION_SIGNING_KEYS",
    )
    assert again == first
    assert parse_signing_key(first["APPROVALS_AUDIT_SIGNING_KEY"])
    assert [k for k, _ in parse_encryption_keys(first["APPROVALS_DECISION_SIGNING_KEYS"])] == [
        "dev1"
    ]
    assert [k for k, _ in parse_encryption_keys(first["APPROVALS_AUDIT_KEYS"])] == ["dev1"]
    assert first["APPROVALS_AUDIT_KEYS"] != first["APPROVALS_ENCRYPTION_KEYS"]
    assert path.stat().st_mode & 0o777 == 0o600
    assert capsys.readouterr().err.count("WARNING: generated development secrets") == 1


def test_load_dev_secrets_adds_the_audit_keys_to_an_older_file(tmp_path, capsys):
    path = tmp_path / ".dev-keys.env"
    path.write_text(f"DJANGO_SECRET_KEY=kept\nAPPROVALS_ENCRYPTION_KEYS=dev1:{KEY_A}")

    values = load_dev_secrets(path)

    assert (values["DJANGO_SECRET_KEY"], values["APPROVALS_ENCRYPTION_KEYS"]) == (
        "kept",
        f"dev1:{KEY_A}",
    )
    assert load_dev_secrets(path) == values
    assert capsys.readouterr().err.splitlines() == [
        "WARNING: generated development secrets in .dev-keys.env (git-ignored): "
        "APPROVALS_AUDIT_KEYS, APPROVALS_AUDIT_SIGNING_KEY, APPROVALS_DECISION_SIGNING_KEYS. "
        "Set DJANGO_SECRET_KEY, APPROVALS_ENCRYPTION_KEYS, APPROVALS_AUDIT_KEYS, "
        "APPROVALS_AUDIT_SIGNING_KEY, APPROVALS_DECISION_SIGNING_KEYS for any real deployment."
    ]
