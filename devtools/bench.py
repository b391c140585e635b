"""Helpers of `manage.py bench`: the bench database, processes, clones, data and measures.

Nothing here is used by the console itself. The bench runs against its own PostgreSQL
database (its name must contain "bench"), dropped and recreated at the start of every run.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from approvals import audit, services
from approvals.canonical import arguments_digest, canonical_arguments
from approvals.models import AuditEvent, Run, RunStatus, Tenant, Ticket, TicketStatus

# Processes and start_web are used by the bench command through this module.
from devtools.processes import Proc, Processes, child_env, start_web  # noqa: F401

TEMPLATE_RELEASE = "2026.01.01-t0000"
PASSWORD = "bench-pass-2026"


# --- statistics -------------------------------------------------------------------------------


def pct(values: Iterable[float], q: float) -> float:
    data = sorted(values)
    if not data:
        return float("nan")
    rank = (len(data) - 1) * q
    low = int(rank)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (rank - low)


def summary_ms(seconds: Iterable[float]) -> dict[str, float]:
    data = [s * 1000 for s in seconds]
    return {
        "n": len(data),
        "p50": round(pct(data, 0.50), 2),
        "p95": round(pct(data, 0.95), 2),
        "p99": round(pct(data, 0.99), 2),
        "mean": round(statistics.fmean(data), 2) if data else float("nan"),
        "max": round(max(data), 2) if data else float("nan"),
    }


# --- the bench database -----------------------------------------------------------------------


def bench_database_name() -> str:
    params = connection.settings_dict
    if connection.vendor != "postgresql":
        raise SystemExit(
            "bench needs PostgreSQL: DATABASE_URL=postgres://postgres@127.0.0.1:5432/approvals_bench"
        )
    name = params["NAME"]
    if "bench" not in name:
        raise SystemExit(
            f"refusing to drop database {name!r}: the bench database's name must contain 'bench'"
        )
    return name


def recreate_database() -> str:
    """DROP and CREATE the bench database (never another one), then migrate it."""
    import psycopg
    from django.core.management import call_command

    name = bench_database_name()
    connection.close()
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params["dbname"] = "postgres"
    with psycopg.connect(**params, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        )
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    call_command("migrate", interactive=False, verbosity=0)
    return name


def sessions_opened() -> int:
    """Connections ever opened to this database (pg_stat_database.sessions, PostgreSQL 14+)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


# --- processes --------------------------------------------------------------------------------


def subprocess_env(**extra: str) -> dict[str, str]:
    """A bench child: the parent's database and keys, production-like DEBUG, quiet logs."""
    return child_env(**{"DJANGO_DEBUG": "0", "LOG_LEVEL": "WARNING", **extra})


# --- cloning one real paused run --------------------------------------------------------------


def make_template(tenant: Tenant, requester) -> tuple[Run, str]:
    """One real paused run of the release agent; its state JSON text, decrypted."""
    from agents import Runner

    from approvals import registry

    agent = registry.get_spec("release", "1").build()
    result = asyncio.run(
        Runner.run(agent, f"Deploy release {TEMPLATE_RELEASE} to production", context={})
    )
    run = services.pause_run(
        result, tenant=tenant, agent_key="release", agent_version="1", requested_by=requester
    )
    return run, json.dumps(services.open_state(run), ensure_ascii=False)


def _refingerprint(state: dict) -> None:
    """The SDK fingerprints each tool call's arguments; recompute them for the edited calls."""
    from agents._tool_invocation import tool_invocation_identity_and_scope

    invocations = state.get("context", {}).get("tool_invocations") or {}
    raw_items = {}
    for item in state.get("generated_items", []):
        raw = item.get("raw_item") or {}
        if raw.get("call_id") in invocations:
            raw_items[raw["call_id"]] = raw
    for call_id, record in invocations.items():
        identity = tool_invocation_identity_and_scope(raw_items[call_id])
        record["approval_scope"] = identity[2]
        record["fingerprint"] = identity[3]


def clone_state(template_text: str, release: str) -> tuple[dict, bytes]:
    state = json.loads(template_text.replace(TEMPLATE_RELEASE, release))
    _refingerprint(state)
    return state, json.dumps(state, ensure_ascii=False, allow_nan=False).encode()


@dataclass
class Clone:
    run_id: int
    ticket_id: int
    release: str


def clone_runs(
    template: Run, template_text: str, tenant: Tenant, requester, releases: list[str]
) -> list[Clone]:
    """Paused runs like the template, each for its own release, re-sealed to its own row.

    Bulk inserts, no audit events for the clones (the worker appends its own to the chain).
    """
    template_ticket = Ticket.objects.get(run=template)
    now = timezone.now()
    clones: list[Clone] = []
    for start in range(0, len(releases), 1000):
        batch = releases[start : start + 1000]
        with transaction.atomic():
            runs = Run.objects.bulk_create(
                [
                    Run(
                        tenant=tenant,
                        agent_key=template.agent_key,
                        agent_version=template.agent_version,
                        schema_version=template.schema_version,
                        title=f"Deploy release {release} to production",
                        requested_by=requester,
                        state_key_id="",
                        state_nonce=b"",
                        state_ciphertext=b"",
                        created_at=now,
                        updated_at=now,
                    )
                    for release in batch
                ]
            )
            tickets = []
            for run, release in zip(runs, batch, strict=True):
                state, payload = clone_state(template_text, release)
                services._seal_state(run, payload, generation=1)
                raw = json.dumps({"release": release, "environment": "production"})
                tickets.append(
                    Ticket(
                        run=run,
                        tenant=tenant,
                        generation=1,
                        agent_name=template_ticket.agent_name,
                        tool_name=template_ticket.tool_name,
                        tool_call_id=template_ticket.tool_call_id.replace(
                            TEMPLATE_RELEASE, release
                        ),
                        arguments_json=canonical_arguments(raw),
                        arguments_digest=arguments_digest(raw),
                        requested_by=requester,
                        created_at=now,
                        expires_at=now + settings.APPROVALS_TICKET_TTL,
                    )
                )
            Run.objects.bulk_update(
                runs, ["state_key_id", "state_nonce", "state_ciphertext"], batch_size=500
            )
            Ticket.objects.bulk_create(tickets)
            clones += [
                Clone(r.pk, t.pk, rel) for r, t, rel in zip(runs, tickets, batch, strict=True)
            ]
    return clones


def approve_in_bulk(clones: list[Clone], approver, *, enqueue: bool = True) -> None:
    """What decide() leaves behind for many runs at once: approved tickets, queued runs, tasks."""
    from approvals.tasks import resume_run_task

    now = timezone.now()
    with transaction.atomic():
        Ticket.objects.filter(pk__in=[c.ticket_id for c in clones]).update(
            status=TicketStatus.APPROVED, decided_by=approver, decided_at=now
        )
        Run.objects.filter(pk__in=[c.run_id for c in clones]).update(
            status=RunStatus.QUEUED, updated_at=now
        )
        if enqueue:
            for clone in clones:
                resume_run_task.enqueue(clone.run_id)
            with connection.cursor() as cursor:
                cursor.execute(f"NOTIFY {services.WAKE_CHANNEL}")


def finished_count(run_ids: list[int]) -> int:
    return Run.objects.filter(
        pk__in=run_ids,
        status__in=[RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.NEEDS_ATTENTION],
    ).count()


def wait_finished(run_ids: list[int], *, timeout: float, procs: list[Proc]) -> float:
    deadline = time.monotonic() + timeout
    while finished_count(run_ids) < len(run_ids):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{len(run_ids) - finished_count(run_ids)} runs unfinished after {timeout:.0f}s\n"
                + "\n".join(p.tail() for p in procs)
            )
        dead = [p for p in procs if not p.alive()]
        if dead:
            raise RuntimeError("a worker died\n" + "\n".join(p.tail() for p in dead))
        time.sleep(0.05)
    return time.monotonic()


def span_seconds(run_ids: list[int]) -> float:
    """From the first claim (run.resuming event) to the last finish, as stored."""
    first = (
        AuditEvent.objects.filter(action="run.resuming", run_id__in=run_ids)
        .order_by("created_at")
        .values_list("created_at", flat=True)
        .first()
    )
    last = (
        Run.objects.filter(pk__in=run_ids)
        .order_by("-finished_at")
        .values_list("finished_at", flat=True)
        .first()
    )
    return (last - first).total_seconds()


def exactly_once(releases: Iterable[str]) -> dict[str, int]:
    from devtools import demo

    wanted = set(releases)
    counts = Counter(
        e["release"] for e in demo.read_effects("deploy_release") if e["release"] in wanted
    )
    return {
        "expected": len(wanted),
        "effects": sum(counts.values()),
        "duplicates": sum(n - 1 for n in counts.values() if n > 1),
        "lost": len(wanted - set(counts)),
    }


def statuses(run_ids: list[int]) -> dict[str, int]:
    return dict(Counter(Run.objects.filter(pk__in=run_ids).values_list("status", flat=True)))


# --- the bare SDK doing the same work ---------------------------------------------------------


def bare_resume_ms(template_text: str, iterations: int, effect_log: Path) -> list[float]:
    """RunState.from_json + approve + Runner.run in-process, with the same scripted model and a
    tool of the same name and schema whose effect is the same file append, without the console."""
    from agents import Agent, Runner, RunState, function_tool

    from devtools import demo

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
    from agents import Agent, Runner, function_tool
    from agents.testing import ModelStep, ScriptedModel, function_call

    from devtools import demo

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
    from devtools import demo

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
        run = services.pause_run(
            result, tenant=tenant, agent_key="release", agent_version="1", requested_by=requester
        )
        paused.append(time.perf_counter() - started)
    raw_size = len(json.dumps(raw, ensure_ascii=False).encode())
    blob = len(bytes(run.state_ciphertext)) + len(bytes(run.state_nonce))
    # The serialisation alone, as pause_run does it, without the database writes.
    serialise = []
    for _ in range(repeats):
        started = time.perf_counter()
        _, payload = services.serialize_state(
            result.to_state(),
            context=result.context_wrapper.context,
            context_serializer=demo.release_context_serializer,
        )
        from approvals import crypto

        crypto.seal(payload, purpose=services.STATE_PURPOSE, tenant=1, run=1, generation=1)
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


# --- 100,000 tickets and 300,000 audit events over 20 tenants --------------------------------


def _copy(table: str, columns: list[str], rows: Iterable[tuple]) -> None:
    connection.ensure_connection()
    cols = ", ".join(columns)
    with (
        connection.connection.cursor() as cursor,
        cursor.copy(f"COPY {table} ({cols}) FROM STDIN") as copy,
    ):
        for row in rows:
            copy.write_row(row)


def load_page_data(
    tenants: list[Tenant],
    requesters: list,
    *,
    tickets_per_tenant: int,
    events_per_tenant: int,
    tickets_per_run: int = 10,
) -> None:
    """Runs, pending tickets and hash-chained audit events, by COPY. Appends to what exists."""
    now = timezone.now()
    expires = now + timedelta(days=30)
    tools = ["deploy_release", "publish_invoice", "rotate_credentials", "scale_cluster"]
    actions = ["ticket.created", "ticket.approved", "run.resuming", "effect.done"]
    for t_index, tenant in enumerate(tenants):
        requester = requesters[t_index % len(requesters)]
        runs_needed = -(-tickets_per_tenant // tickets_per_run)
        with transaction.atomic():
            runs = Run.objects.bulk_create(
                [
                    Run(
                        tenant=tenant,
                        agent_key="release" if n % 2 else "invoice",
                        agent_version="1",
                        schema_version="1.21",
                        title=f"Bulk run {n} of {tenant.slug}",
                        requested_by=requester,
                        state_key_id="bench",
                        state_nonce=b"",
                        state_ciphertext=b"",
                        created_at=now - timedelta(minutes=n),
                        updated_at=now,
                    )
                    for n in range(runs_needed)
                ],
                batch_size=2000,
            )

            def ticket_rows(tenant=tenant, runs=runs, requester=requester, t_index=t_index):
                for n in range(tickets_per_tenant):
                    run = runs[n // tickets_per_run]
                    tool = tools[n % len(tools)]
                    raw = json.dumps({"target": f"{tenant.slug}-{n}", "size": n % 7})
                    yield (
                        run.pk,
                        tenant.pk,
                        1,
                        run.agent_key,
                        tool,
                        f"call_{tenant.slug}_{n}",
                        canonical_arguments(raw),
                        arguments_digest(raw),
                        requester.pk,
                        now - timedelta(seconds=n * 7 + t_index),
                        expires,
                        TicketStatus.PENDING,
                        "",
                        False,
                        "",
                        "",
                    )

            _copy(
                "approvals_ticket",
                [
                    "run_id",
                    "tenant_id",
                    "generation",
                    "agent_name",
                    "tool_name",
                    "tool_call_id",
                    "arguments_json",
                    "arguments_digest",
                    "requested_by_id",
                    "created_at",
                    "expires_at",
                    "status",
                    "decision_message",
                    "always",
                    # Decided by a person, rule or expiry (policies); blank while pending.
                    "decision_source",
                    "decision_reason",
                ],
                ticket_rows(),
            )
            locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
            prev = locked.audit_head or audit.GENESIS
            seq = locked.audit_seq
            rows = []
            start = now - timedelta(seconds=events_per_tenant * 3)
            for n in range(events_per_tenant):
                seq += 1
                event = AuditEvent(
                    tenant_id=tenant.pk,
                    seq=seq,
                    created_at=start + timedelta(seconds=n * 3, microseconds=t_index),
                    actor_id=requester.pk,
                    actor_name=requester.username,
                    action=actions[n % len(actions)],
                    run_id=runs[(n // 3) % len(runs)].pk,
                    ticket_id=None,
                    tool_name=tools[n % len(tools)],
                    arguments_digest="",
                    outcome="done" if n % 4 == 3 else "pending",
                    detail={"n": n},
                    prev_hash=prev,
                )
                event.hash = audit.event_hash(event)
                prev = event.hash
                rows.append(
                    (
                        event.tenant_id,
                        event.seq,
                        event.created_at,
                        event.actor_id,
                        event.actor_name,
                        event.action,
                        event.run_id,
                        event.tool_name,
                        event.arguments_digest,
                        event.outcome,
                        json.dumps(event.detail),
                        event.prev_hash,
                        event.hash,
                    )
                )
            _copy(
                "approvals_auditevent",
                [
                    "tenant_id",
                    "seq",
                    "created_at",
                    "actor_id",
                    "actor_name",
                    "action",
                    "run_id",
                    "tool_name",
                    "arguments_digest",
                    "outcome",
                    "detail",
                    "prev_hash",
                    "hash",
                ],
                rows,
            )
            Tenant.objects.filter(pk=tenant.pk).update(audit_seq=seq, audit_head=prev)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def measure_page(client, path: str, *, repeats: int, warmup: int) -> dict[str, Any]:
    from django.test.utils import CaptureQueriesContext

    first = None
    times, queries = [], []
    for n in range(warmup + repeats):
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            response = client.get(path)
            elapsed = time.perf_counter() - started
        if response.status_code != 200:
            raise RuntimeError(f"GET {path} answered {response.status_code}")
        if first is None:
            first = elapsed
        if n >= warmup:
            times.append(elapsed)
            queries.append(len(captured))
    return {
        "path": path,
        "first_request_ms": round(first * 1000, 1),
        "ms": summary_ms(times),
        "queries": max(queries),
        "bytes": len(response.content),
    }


# --- profiles ---------------------------------------------------------------------------------


def profile(fn: Callable[[], Any], *, top: int = 25) -> str:
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        fn()
    finally:
        profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    out.write("\n--- by own time ---\n")
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()
