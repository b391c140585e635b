"""OpenID Connect providers from the environment (config.env.oidc_providers): a good one becomes
allauth's app, a bad one stops start-up with one line that names what to fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.env import oidc_providers

ROOT = Path(__file__).resolve().parent.parent.parent
SINGLE = {
    "APPROVALS_OIDC_ISSUER": "https://idp.example.com/realms/acme/",
    "APPROVALS_OIDC_CLIENT_ID": "console",
    "APPROVALS_OIDC_CLIENT_SECRET": "s3cret",
}


@pytest.fixture
def env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("APPROVALS_OIDC_"):
            monkeypatch.delenv(name)

    def set_env(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return set_env


def test_nothing_set_means_no_single_sign_on(env):
    assert oidc_providers() == []


def test_one_provider_from_the_single_variables(env):
    env(**SINGLE, APPROVALS_OIDC_NAME="Acme Keycloak", APPROVALS_OIDC_GROUPS_CLAIM="roles")
    [app] = oidc_providers()
    assert app["provider_id"] == "sso" and app["name"] == "Acme Keycloak"
    assert (app["client_id"], app["secret"]) == ("console", "s3cret")
    assert app["settings"]["server_url"] == "https://idp.example.com/realms/acme"
    assert app["settings"]["groups_claim"] == "roles"
    assert app["settings"]["oauth_pkce_enabled"] is True
    assert app["settings"]["scope"] == ["openid", "profile", "email"]


def test_several_providers_from_json(env):
    env(
        APPROVALS_OIDC_PROVIDERS=json.dumps(
            [
                {"id": "okta", "issuer": "https://acme.okta.com", "client_id": "a", "secret": "b"},
                {
                    "id": "entra",
                    "issuer": "https://login.microsoftonline.com/tid/v2.0",
                    "client_id": "c",
                    "secret": "d",
                    "scopes": "openid email",
                },
            ]
        )
    )
    apps = oidc_providers()
    assert [a["provider_id"] for a in apps] == ["okta", "entra"]
    assert apps[1]["settings"]["scope"] == ["openid", "email"]
    assert apps[0]["settings"]["groups_claim"] == "groups"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"APPROVALS_OIDC_PROVIDERS": "[{"}, "APPROVALS_OIDC_PROVIDERS is not JSON"),
        ({"APPROVALS_OIDC_PROVIDERS": '{"id": "x"}'}, "must be a JSON list of objects"),
        (
            {"APPROVALS_OIDC_PROVIDERS": '["okta"]'},
            "APPROVALS_OIDC_PROVIDERS[0] must be an object with issuer, client_id, secret",
        ),
        (
            {**SINGLE, "APPROVALS_OIDC_CLIENT_SECRET": ""},
            "APPROVALS_OIDC_ISSUER/_CLIENT_ID/_CLIENT_SECRET needs secret",
        ),
        (
            {**SINGLE, "APPROVALS_OIDC_ISSUER": "idp.example.com"},
            "issuer 'idp.example.com' is not an http(s) URL",
        ),
        (
            {**SINGLE, "APPROVALS_OIDC_ISSUER": "ftp://idp.example.com"},
            "is not an http(s) URL",
        ),
        ({**SINGLE, "APPROVALS_OIDC_ID": "Okta Prod"}, "must be lower-case letters"),
        (
            {
                **SINGLE,
                "APPROVALS_OIDC_PROVIDERS": json.dumps(
                    [{"issuer": "https://a.example", "client_id": "a", "secret": "b"}]
                ),
            },
            "OpenID Connect provider ids repeat: sso, sso",
        ),
    ],
)
def test_a_bad_provider_is_refused_with_what_to_fix(env, values, message):
    env(**values)
    with pytest.raises(ImproperlyConfigured) as raised:
        oidc_providers()
    assert message in str(raised.value)


def test_manage_check_stops_on_a_bad_provider_with_one_line():
    environment = {k: v for k, v in os.environ.items() if not k.startswith("APPROVALS_OIDC_")}
    environment.update(APPROVALS_OIDC_PROVIDERS="not json")
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "configuration error: APPROVALS_OIDC_PROVIDERS is not JSON: Expecting value: line 1 "
        "column 1 (char 0)"
    ]


def test_the_providers_origins_are_allowed_as_form_targets(env):
    from config.env import oidc_origin

    env(**SINGLE)
    [app] = oidc_providers()
    assert oidc_origin(app) == "https://idp.example.com"
    env(APPROVALS_OIDC_AUTHORIZE_ORIGIN="https://login.example.net")
    [app] = oidc_providers()
    assert oidc_origin(app) == "https://login.example.net"
    env(APPROVALS_OIDC_AUTHORIZE_ORIGIN="https://login.example.net/authorize")
    with pytest.raises(ImproperlyConfigured, match="is not scheme://host"):
        oidc_providers()


def test_the_csp_form_action_names_the_providers(settings):
    from django.http import HttpResponse
    from django.test import RequestFactory

    from approvals.middleware import SecurityHeadersMiddleware

    settings.CSP_FORM_ACTION_ORIGINS = ["https://idp.example.com"]
    middleware = SecurityHeadersMiddleware(lambda request: HttpResponse())
    policy = middleware(RequestFactory().get("/login/"))["Content-Security-Policy"]
    assert "form-action 'self' https://idp.example.com;" in policy
    assert "script-src 'self';" in policy
