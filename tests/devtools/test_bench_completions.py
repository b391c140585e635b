"""The bench hears runs finish from the tenant's live hints (Redis), as a person's page does."""

from __future__ import annotations

import uuid

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from approvals.live import hints
from devtools.bench.completions import Completions

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
