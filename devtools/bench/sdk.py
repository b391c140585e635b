"""The console against the bare SDK: a resume in-process, pause_run against to_json."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from agents import Agent, Runner, RunState, function_tool
from agents.testing import ModelStep, ScriptedModel, function_call

from approvals.core import crypto
from approvals.execution.state import STATE_PURPOSE, serialize_state
from approvals.models import Tenant
from approvals.runs.pause import pause_run
from devtools import demo
from devtools.bench.clones import clone_state
from devtools.bench.stats import pct, summary_ms

# --- the bare SDK doing the same work ---------------------------------------------------------


def bare_resume_ms(template_text: str, iterations: int, effect_log: Path) -> list[float]:
    """RunState.from_json + approve + Runner.run in-process, with the same scripted model and a
    tool of the same name and schema whose effect is the same file append, without the console."""

    @function_tool(needs_approval=True, failure_error_function=None, name_override="deploy_release")
    def bare_deploy_release(release: str, environment: str) -> str:
        """Deploy a release to an environment (staging or production)."""
        line = json.dumps({"op": "deploy_release", "release": release, "pid": os.getpid()})
        fd = os.open(effect_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
        return f"Release {release} is live on {environment}."

    def build() -> Agent:
        agent = demo.build_release_agent()
        return agent.clone(tools=[bare_deploy_release])

    async def once(text: str) -> float:
        started = time.perf_counter()
        agent = build()
        state = await RunState.from_json(
            agent,
            json.loads(text),
            context_deserializer=demo.release_context_deserializer,
            strict_context=True,
        )
        for item in state.get_interruptions():
            state.approve(item)
        result = await Runner.run(agent, state)
        assert "is live" in str(result.final_output), result.final_output
        return time.perf_counter() - started

    texts = [clone_state(template_text, f"2026.01.01-b{n:05d}")[1].decode() for n in range(8)]

    async def all_of_them() -> list[float]:
        return [await once(texts[n % len(texts)]) for n in range(iterations)]

    return asyncio.run(all_of_them())


# --- pause_run against a bare to_json, by number of turns -------------------------------------


def multi_turn_result(turns: int):
    """A paused RunResult whose state holds `turns` model turns: turns-1 calls of a lookup tool
    (no approval), then the deploy_release call that needs one."""

    @function_tool
    def lookup_status(service: str) -> str:
        """Read the health of a service before a deployment."""
        return (
            f"Service {service}: healthy; p99 latency 182 ms over the last hour; 0 errors in "
            f"the last 10,000 requests; last deployed 2026-01-01 by the release pipeline; "
            f"owners: platform-team; runbook: https://runbooks.example/{service}"
        )

    def responder(call):
        done = sum(
            1
            for item in call.input
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        )
        if done < turns - 1:
            return [
                function_call(
                    "lookup_status", {"service": f"svc-{done:03d}"}, call_id=f"call_lookup_{done}"
                )
            ]
        return [
            function_call(
                "deploy_release",
                {"release": "2026.02.02-m1", "environment": "production"},
                call_id="call_deploy_2026.02.02-m1_production",
            )
        ]

    agent = Agent(
        name="release",
        instructions="You deploy releases after checking each service.",
        model=ScriptedModel([ModelStep.respond(responder) for _ in range(turns + 2)]),
        tools=[lookup_status, demo.deploy_release],
    )
    result = asyncio.run(
        Runner.run(
            agent, "Deploy release 2026.02.02-m1 to production", context={}, max_turns=turns + 5
        )
    )
    assert result.interruptions, "the multi-turn agent did not pause"
    return result


def measure_pause(tenant: Tenant, requester, turns: int, repeats: int) -> dict[str, Any]:

    result = multi_turn_result(turns)
    bare, paused = [], []
    run = None
    for _ in range(repeats):
        started = time.perf_counter()
        raw = result.to_state().to_json(
            context_serializer=demo.release_context_serializer, strict_context=True
        )
        bare.append(time.perf_counter() - started)
        started = time.perf_counter()
        run = pause_run(
            result, tenant=tenant, agent_key="release", agent_version="1", requested_by=requester
        )
        paused.append(time.perf_counter() - started)
    raw_size = len(json.dumps(raw, ensure_ascii=False).encode())
    blob = len(bytes(run.state_ciphertext)) + len(bytes(run.state_nonce))
    # The serialisation alone, as pause_run does it, without the database writes.
    serialise = []
    for _ in range(repeats):
        started = time.perf_counter()
        _, payload = serialize_state(
            result.to_state(),
            context=result.context_wrapper.context,
            context_serializer=demo.release_context_serializer,
        )

        crypto.seal(payload, purpose=STATE_PURPOSE, tenant=1, run=1, generation=1)
        serialise.append(time.perf_counter() - started)
    return {
        "turns": turns,
        "to_json_ms": summary_ms(bare),
        "pause_run_ms": summary_ms(paused),
        "serialize_and_seal_ms": summary_ms(serialise),
        "ratio_p50": round(pct(paused, 0.5) / pct(bare, 0.5), 2),
        "serialize_and_seal_ratio_p50": round(pct(serialise, 0.5) / pct(bare, 0.5), 2),
        "raw_json_bytes": raw_size,
        "blob_bytes": blob,
        "blob_vs_json": round(blob / raw_size, 3),
    }
