"""The bench hears runs finish from the tenant's live hints (Redis), as a person's page does."""

from __future__ import annotations

import uuid

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from approvals.decisions.decide import decide
from approvals.live import hints
from approvals.models import AuditEvent, Role, Ticket
from approvals.runs.resume import resume
from devtools.bench.completions import Completions, phases
from tests.support import TenantFactory, member, paused_run

REDIS_TEST_URL = "redis://127.0.0.1:6379/14"


@pytest.fixture
def redis_layer(settings):
    try:
        redis.Redis.from_url(REDIS_TEST_URL, socket_connect_timeout=1).ping()
    except redis.RedisError:
        pytest.skip(f"no Redis at {REDIS_TEST_URL}")
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [REDIS_TEST_URL], "prefix": f"test-bench:{uuid.uuid4().hex}"},
        }
    }


def _hint(tenant_id: int, **data) -> None:
    message = {"type": "console.event", "kind": "run.changed", "tenant": tenant_id, **data}
    async_to_sync(get_channel_layer().group_send)(hints.tenant_group(tenant_id), message)


def test_a_run_is_heard_finishing_and_other_hints_are_passed_over(redis_layer):
    completions = Completions(7)
    try:
        _hint(7, run=2, status="queued")
        _hint(7, run=3, status="completed")
        _hint(8, run=2, status="completed")
        _hint(7, run=2, status="resuming")
        _hint(7, run=2, status="failed")

        assert completions.finished(2, timeout=5) == "failed"
        # The next wait hears the hints sent after this one.
        _hint(7, run=4, status="completed")
        assert completions.finished(4, timeout=5) == "completed"
    finally:
        completions.close()


def test_a_run_never_heard_finishing_times_out(redis_layer):
    completions = Completions(7)
    try:
        _hint(7, run=2, status="resuming")
        with pytest.raises(TimeoutError):
            completions.finished(2, timeout=0.3)
    finally:
        completions.close()


def test_the_in_memory_layer_is_refused(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    with pytest.raises(RuntimeError, match="REDIS_URL"):
        Completions(7)


@pytest.mark.django_db(transaction=True)
def test_the_phases_of_approve_to_completed_come_from_the_runs_audit_events():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER, "req"))
    decide(Ticket.objects.get(run=run), user=member(tenant, Role.APPROVER, "ann"), approve=True)
    resume(run_id=run.pk, worker_id="w")
    at = {
        action: created_at.timestamp()
        for action, created_at in AuditEvent.objects.filter(run=run).values_list(
            "action", "created_at"
        )
    }
    claimed, effect, ended = at["run.resuming"], at["effect.done"], at["run.completed"]

    steps = phases([(run.pk, claimed - 0.010, claimed - 0.002, ended + 0.003), (999, 0, 1, 2)])

    def ms(seconds: float) -> float:
        return round(seconds * 1000, 2)

    # The run without events (999) is left out; each step is one run's.
    assert {name: s["n"] for name, s in steps.items()} == dict.fromkeys(
        ["decision", "answer_to_claim", "claim_to_effect", "effect_to_end", "end_to_heard"], 1
    )
    assert steps["decision"]["p50"] == 8.0
    assert steps["answer_to_claim"]["p50"] == 2.0
    assert steps["claim_to_effect"]["p50"] == ms(effect - claimed)
    assert steps["effect_to_end"]["p50"] == ms(ended - effect)
    assert steps["end_to_heard"]["p50"] == 3.0
    assert claimed < effect < ended
