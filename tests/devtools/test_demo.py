"""The demo agents are registered in development, where the tests run."""

from __future__ import annotations

from django.conf import settings

from approvals.execution import registry
from devtools import demo


def test_tests_run_with_development_settings_and_the_demo_agents_registered():
    release = registry.get_spec("release", "1")
    invoice = registry.get_spec("invoice", "1")

    assert settings.APPROVALS_ENV == "development"
    assert (release.factory, release.context_serializer, release.context_deserializer) == (
        demo.build_release_agent,
        demo.release_context_serializer,
        demo.release_context_deserializer,
    )
    assert invoice.factory is demo.build_invoice_agent
