"""devtools (the demo agents, seed_demo, webhook_receiver, the bench) is development tooling:
production settings leave the app out and register no agent; development has both.

Each environment's settings are read in a subprocess started with its variables, as a
deployment would start them (the test process itself runs in development)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support import SETTINGS_VARIABLES

ROOT = Path(__file__).resolve().parent.parent.parent
KEY = base64.urlsafe_b64encode(b"d" * 32).decode()
DEVTOOLS_COMMANDS = ("bench", "seed_demo", "webhook_receiver")
SCRIPT = """
import json, django
django.setup()
from django.apps import apps
from django.conf import settings
from django.core.management import get_commands
from approvals.execution import registry
try:
    release = registry.get_spec("release", "1").factory.__module__
except registry.UnknownAgentError as error:
    release = str(error)
commands = get_commands()
print(json.dumps({
    "devtools_installed": apps.is_installed("devtools"),
    "agents": settings.APPROVALS_AGENTS,
    "release_factory_module": release,
    "commands": {name: commands.get(name) for name in %(commands)r},
}))
"""


def _seen_by_django(**overrides: str) -> dict:
    """What django.setup() makes of the settings in a process started with this environment."""
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS_VARIABLES}
    # Every secret set, so that development settings never write .dev-keys.env.
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DATABASE_URL="sqlite:///var/helper-devtools-settings.sqlite3",
        DJANGO_SECRET_KEY="test-secret-key-for-devtools-settings-tests",
        APPROVALS_ENCRYPTION_KEYS=f"k1:{KEY}",
        APPROVALS_AUDIT_KEYS=f"a1:{KEY}",
        APPROVALS_AUDIT_SIGNING_KEY=KEY,
        APPROVALS_DECISION_SIGNING_KEYS=f"d1:{KEY}",
        DJANGO_ALLOWED_HOSTS="console.example.com",
        APPROVALS_PUBLIC_URL="https://console.example.com",
        **overrides,
    )
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT % {"commands": DEVTOOLS_COMMANDS}],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_production_leaves_devtools_out_and_registers_no_demo_agent():
    seen = _seen_by_django(APPROVALS_ENV="production")

    assert seen == {
        "devtools_installed": False,
        "agents": {},
        "release_factory_module": "agent 'release' is not registered (neither in APPROVALS_AGENTS "
        "nor by an approvals.agents entry point)",
        "commands": dict.fromkeys(DEVTOOLS_COMMANDS),
    }


def test_development_installs_devtools_and_registers_the_demo_agents():
    seen = _seen_by_django()  # APPROVALS_ENV unset: development, the default

    assert seen == {
        "devtools_installed": True,
        "agents": {
            "release": {
                "1": {
                    "factory": "devtools.demo.build_release_agent",
                    "context_serializer": "devtools.demo.release_context_serializer",
                    "context_deserializer": "devtools.demo.release_context_deserializer",
                    "targets": {"deploy_release": ["environment"]},
                }
            },
            "invoice": {
                "1": {
                    "factory": "devtools.demo.build_invoice_agent",
                    "targets": {"publish_invoice": []},
                }
            },
        },
        "release_factory_module": "devtools.demo",
        "commands": dict.fromkeys(DEVTOOLS_COMMANDS, "devtools"),
    }
