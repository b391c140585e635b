"""The queue and audit pages at scale: tickets and chained audit events by COPY, timed GETs."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.audit import chain as audit
from approvals.core import signatures
from approvals.core.canonical import arguments_digest, canonical_arguments
from approvals.models import AuditEvent, Run, Tenant, TicketStatus
from devtools.bench.stats import summary_ms

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
            key_id = signatures.audit_key_id()
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
                    hash_key_id=key_id,
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
                        event.hash_key_id,
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
                    "hash_key_id",
                ],
                rows,
            )
            Tenant.objects.filter(pk=tenant.pk).update(audit_seq=seq, audit_head=prev)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def measure_page(client, path: str, *, repeats: int, warmup: int) -> dict[str, Any]:

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
