"""Production settings with a single sign-on provider: `check --deploy` stays clean and the
sign-in page's CSP lets the "Sign in with ..." form reach the provider, and nothing else."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import database_url
from tests.security.test_deploy_settings import ROOT, production_env, python

OKTA = {
    "APPROVALS_OIDC_ISSUER": "https://acme.okta.com/oauth2/default",
    "APPROVALS_OIDC_CLIENT_ID": "console",
    "APPROVALS_OIDC_CLIENT_SECRET": "s3cret-from-the-vault",
    "APPROVALS_OIDC_NAME": "Okta",
}


def test_deploy_check_is_clean_with_a_provider():
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=production_env(**OKTA),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (result.returncode, result.stderr) == (0, "")


# The sign-in page reads allauth's provider apps: the subprocess uses the test database.
@pytest.mark.django_db(transaction=True)
def test_the_login_pages_csp_allows_the_providers_origin_only():
    code = (
        "import django; django.setup()\n"
        "from django.test import Client\n"
        "c = Client(HTTP_HOST='console.example.com', HTTP_X_FORWARDED_PROTO='https')\n"
        "r = c.get('/login/', secure=True)\n"
        "print(r['Content-Security-Policy'])\n"
    )
    result = python(code, production_env(DATABASE_URL=database_url(), **OKTA))
    assert result.returncode == 0, result.stderr
    directives = result.stdout.strip().split("; ")
    assert "form-action 'self' https://acme.okta.com" in directives
    assert "script-src 'self'" in directives and "default-src 'self'" in directives
