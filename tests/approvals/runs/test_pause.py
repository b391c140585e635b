"""pause_run: one ticket per interruption, an encrypted blob, and nothing written on refusal."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from dataclasses import dataclass

import pytest
from agents.memory import SQLiteSession
from agents.run_state import CURRENT_SCHEMA_VERSION
from django.conf import settings

from approvals import transitions
from approvals.audit.chain import verify_chain
from approvals.core import crypto, statements
from approvals.core.canonical import arguments_digest
from approvals.decisions import tickets
from approvals.execution import registry
from approvals.execution.sessions import UnsupportedSessionError
from approvals.execution.state import (
    ContextNotSerializableError,
    NoInterruptionsError,
    SecretInContextError,
    open_state,
)
from approvals.models import AuditEvent, Role, Run, RunStatus, Tenant, Ticket, TicketStatus
from approvals.runs.pause import pause_run
from devtools import demo
from tests.support import TenantFactory, member, paused_run, run_agent, two_call_agent

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    # Users are made by the factory with a password; the default PBKDF2 costs ~1 s per user.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


PROMPT = "Deploy release 2026.07.24 to staging and production"
SECRET = "sk-" + "A1b2C3d4E5f6G7h8I9j0"


def assert_nothing_written() -> None:
    assert Run.objects.count() == 0
    assert Ticket.objects.count() == 0
    assert AuditEvent.objects.count() == 0


def pause(result, tenant, **kwargs) -> Run:
    kwargs.setdefault("agent_key", "release")
    kwargs.setdefault("agent_version", "1")
    return pause_run(result, tenant=tenant, **kwargs)


# --- what is stored -----------------------------------------------------------------------------


def test_pause_run_stores_one_ticket_per_interruption():
    tenant = TenantFactory()
    requester = member(tenant, "viewer")
    result = run_agent("release", PROMPT, agent=two_call_agent())

    run = pause(result, tenant, requested_by=requester)

    assert len(result.interruptions) == 2
    tickets = list(Ticket.objects.filter(run=run).order_by("pk"))
    assert [t.tool_call_id for t in tickets] == [
        "call_deploy_2026.07.24_staging",
        "call_deploy_2026.07.24_production",
    ]
    assert [t.tool_name for t in tickets] == ["deploy_release", "deploy_release"]
    assert [t.agent_name for t in tickets] == ["release", "release"]
    assert [t.status for t in tickets] == [TicketStatus.PENDING, TicketStatus.PENDING]
    assert [t.generation for t in tickets] == [1, 1]
    assert [t.requested_by_id for t in tickets] == [requester.pk, requester.pk]
    assert [t.tenant_id for t in tickets] == [tenant.pk, tenant.pk]
    assert tickets[0].expires_at - tickets[0].created_at == settings.APPROVALS_TICKET_TTL
    assert run.status == RunStatus.PAUSED
    assert run.schema_version == CURRENT_SCHEMA_VERSION
    assert run.title == PROMPT
    assert run.state_generation == 1
    assert list(
        AuditEvent.objects.filter(run_id=run.pk).order_by("seq").values_list("action", flat=True)
    ) == ["run.paused", "ticket.created", "ticket.created"]
    assert demo.read_effects() == []


def test_pause_run_ticket_arguments_are_canonical_with_sha256_digest():
    tenant = TenantFactory()
    result = run_agent("release", PROMPT, agent=two_call_agent())
    raw_by_call = {item.call_id: item.arguments for item in result.interruptions}

    run = pause(result, tenant)

    for ticket in Ticket.objects.filter(run=run):
        raw = raw_by_call[ticket.tool_call_id]
        environment = ticket.tool_call_id.rsplit("_", 1)[1]
        # The model wrote release first; canonical JSON sorts keys and drops spaces.
        assert raw == f'{{"release":"2026.07.24","environment":"{environment}"}}'
        assert ticket.arguments_json == (
            f'{{"environment":"{environment}","release":"2026.07.24"}}'
        )
        assert ticket.arguments_digest == arguments_digest(raw)
        assert ticket.arguments_digest == hashlib.sha256(ticket.arguments_json.encode()).hexdigest()
    created = AuditEvent.objects.filter(run_id=run.pk, action="ticket.created")
    assert sorted(created.values_list("arguments_digest", flat=True)) == sorted(
        Ticket.objects.filter(run=run).values_list("arguments_digest", flat=True)
    )


def test_pause_run_encrypts_the_state_under_the_primary_key():
    tenant = TenantFactory()

    run = paused_run(tenant, prompt="Deploy release 2026.07.24 to production")

    run.refresh_from_db()
    ciphertext = bytes(run.state_ciphertext)
    assert run.state_key_id == crypto.primary_key_id()
    assert run.state_key_id == settings.APPROVALS_ENCRYPTION_KEYS[0][0]
    assert len(bytes(run.state_nonce)) == crypto.NONCE_BYTES
    assert len(ciphertext) > 0
    assert b"2026.07.24" not in ciphertext
    assert b"deploy_release" not in ciphertext
    state = open_state(run)
    assert state["$schemaVersion"] == CURRENT_SCHEMA_VERSION
    assert state["original_input"] == "Deploy release 2026.07.24 to production"


def test_pause_run_returns_the_row_it_stored_paused_and_sealed_to_its_own_id():
    tenant = TenantFactory()
    requester = member(tenant, Role.VIEWER, "req")
    result = run_agent("release", PROMPT)

    first = pause(result, tenant, requested_by=requester)
    second = pause(result, tenant, requested_by=requester)
    # One the worker starts is created starting, from the same sequence.
    started = transitions.create_run(
        tenant=tenant, agent_key="release", agent_version="1", title="later"
    )

    assert first.pk < second.pk < started.pk
    stored = Run.objects.get(pk=second.pk)
    for field in Run._meta.concrete_fields:
        value, expected = getattr(second, field.attname), getattr(stored, field.attname)
        if isinstance(expected, memoryview):
            value, expected = bytes(value), bytes(expected)
        assert value == expected, field.name
    assert (stored.status, stored.status_reason) == (RunStatus.PAUSED, "")
    assert (stored.lease_owner, stored.lease_expires_at, stored.attempts) == ("", None, 0)
    assert stored.state_generation == 1
    assert stored.updated_at >= stored.created_at
    assert stored.schema_version == CURRENT_SCHEMA_VERSION
    # Sealed to its own id: it opens as this run's, and as no other's.
    assert open_state(stored)["original_input"] == PROMPT
    stored.pk = first.pk
    with pytest.raises(crypto.CryptoError):
        open_state(stored)
    assert verify_chain(tenant).ok


def test_pause_run_that_fails_after_its_id_was_read_writes_nothing(monkeypatch):
    tenant = TenantFactory()
    result = run_agent("release", PROMPT)
    before = list(Tenant.objects.filter(pk=tenant.pk).values_list("audit_seq", "audit_head"))

    def broken(*args, **kwargs):
        raise RuntimeError("the tickets cannot be opened")

    monkeypatch.setattr(tickets, "open_tickets", broken)
    with pytest.raises(RuntimeError, match="cannot be opened"):
        pause(result, tenant)

    assert_nothing_written()
    assert list(Tenant.objects.filter(pk=tenant.pk).values_list("audit_seq", "audit_head")) == (
        before
    )
    monkeypatch.undo()
    run = pause(result, tenant)
    assert Ticket.objects.filter(run=run).count() == len(result.interruptions) == 1
    assert verify_chain(tenant).ok


def test_only_a_paused_run_with_an_id_is_born_paused():
    tenant = TenantFactory()
    with pytest.raises(transitions.TransitionError):
        transitions.born_paused(
            Run(tenant=tenant, status=RunStatus.STARTING, pk=7), using="default"
        )
    with pytest.raises(transitions.TransitionError):
        transitions.born_paused(Run(tenant=tenant, status=RunStatus.PAUSED), using="default")
    with pytest.raises(ValueError, match="no pk"):
        statements.insert("test", Run(tenant=tenant, status=RunStatus.PAUSED), using="default")


def test_pause_run_records_a_file_sqlite_session(tmp_path):
    tenant = TenantFactory()
    session = SQLiteSession("conv-pause", tmp_path / "sessions.db")
    try:
        run = paused_run(tenant, session=session)
    finally:
        session.close()

    assert (run.session_backend, run.session_id) == ("sqlite", "conv-pause")
    assert run.session_location == str((tmp_path / "sessions.db").resolve())


# --- refusals: nothing written --------------------------------------------------------------------


def test_pause_run_without_interruptions_is_refused():
    tenant = TenantFactory()
    result = run_agent("release", "Deploy the latest build please")

    assert result.final_output == "Which release should I deploy? Give it as YYYY.MM.DD."
    with pytest.raises(NoInterruptionsError):
        pause(result, tenant)

    assert_nothing_written()


def test_pause_run_with_unknown_agent_key_is_refused():
    tenant = TenantFactory()
    result = run_agent("release", PROMPT)

    with pytest.raises(registry.UnknownAgentError, match="'payroll' is not registered"):
        pause(result, tenant, agent_key="payroll")

    assert_nothing_written()


def test_pause_run_with_unknown_agent_version_is_refused():
    tenant = TenantFactory()
    result = run_agent("release", PROMPT)

    with pytest.raises(registry.UnknownAgentError, match="version '2' is not deployed"):
        pause(result, tenant, agent_version="2")

    assert_nothing_written()


@pytest.mark.parametrize(
    ("context", "path"),
    [
        ({"api_key": "do-not-store-1234"}, "context.api_key (key name)"),
        ({"note": SECRET}, "context.note (looks like a OpenAI-style key)"),
        ({"db": {"password": "hunter2hunter2"}}, "context.db.password (key name)"),
        ({"headers": ["Bearer abcdefghijklmnop0123"]}, "context.headers[0] (looks like a "),
    ],
    ids=["key-name", "value-shape", "nested-key-name", "bearer-in-list"],
)
def test_pause_run_with_secret_in_context_is_refused(context, path):
    tenant = TenantFactory()
    result = run_agent("release", PROMPT, context=context)

    with pytest.raises(SecretInContextError) as raised:
        pause(result, tenant)

    message = str(raised.value)
    assert path in message
    # The error names where the secret is, never the secret itself.
    for value in ("do-not-store-1234", SECRET, "hunter2hunter2", "abcdefghijklmnop0123"):
        assert value not in message
    assert_nothing_written()


def test_pause_run_with_lock_in_context_is_refused():
    tenant = TenantFactory()
    result = run_agent("release", PROMPT, context={"lock": threading.Lock(), "ok": 1})

    with pytest.raises(ContextNotSerializableError, match="not JSON serializable"):
        pause(result, tenant)

    assert_nothing_written()


def test_pause_run_with_socket_in_context_is_refused():
    tenant = TenantFactory()
    sock = socket.socket()
    try:
        result = run_agent("release", PROMPT, context={"connection": sock})
        with pytest.raises(ContextNotSerializableError, match="Object of type socket is not JSON"):
            pause(result, tenant)
    finally:
        sock.close()

    assert_nothing_written()


class Client:
    """An application object that is neither a mapping nor serialisable."""

    def __init__(self) -> None:
        self.lock = threading.Lock()


def test_pause_run_with_object_context_and_no_serializer_is_refused():
    tenant = TenantFactory()
    # The invoice agent is registered without a context_serializer.
    result = run_agent("invoice", "Publish test invoice INV-781", context=Client())

    with pytest.raises(ContextNotSerializableError, match="requires context to be a map"):
        pause(result, tenant, agent_key="invoice")

    assert_nothing_written()


def test_pause_run_with_object_context_the_serializer_cannot_read_is_refused():
    tenant = TenantFactory()
    # The release agent's registered serializer expects a mapping.
    result = run_agent("release", PROMPT, context=Client())

    with pytest.raises(ContextNotSerializableError, match="Context serializer failed"):
        pause(result, tenant)

    assert_nothing_written()


def test_pause_run_with_in_memory_sqlite_session_is_refused():
    tenant = TenantFactory()
    session = SQLiteSession("conv-memory")
    try:
        result = run_agent("release", PROMPT, session=session)
        with pytest.raises(UnsupportedSessionError, match="in-memory SQLiteSession"):
            pause(result, tenant, session=session)
    finally:
        session.close()

    assert_nothing_written()


# --- a serializer that leaves the secret out -----------------------------------------------------


@dataclass
class AppContext:
    customer: str
    api_key: str


def without_secret(context) -> dict:
    if isinstance(context, AppContext):
        return {"customer": context.customer}
    return {k: v for k, v in context.items() if k != "api_key"}


def assert_secret_not_stored(run: Run) -> None:
    run.refresh_from_db()
    assert SECRET not in json.dumps(open_state(run))
    events = list(AuditEvent.objects.values())
    assert len(events) == 2
    assert SECRET not in json.dumps(events, default=str)


def test_pause_run_with_serializer_leaves_secret_of_object_context_out():
    tenant = TenantFactory()
    result = run_agent("release", PROMPT, context=AppContext(customer="acme", api_key=SECRET))

    run = pause(result, tenant, context_serializer=without_secret)

    assert open_state(run)["context"]["context"] == {"customer": "acme"}
    assert_secret_not_stored(run)


def test_pause_run_with_serializer_leaves_secret_of_mapping_context_out():
    # The SDK ignores context_serializer for mapping contexts, so pause_run must apply it itself.
    tenant = TenantFactory()
    result = run_agent("release", PROMPT, context={"customer": "acme", "api_key": SECRET})

    run = pause(result, tenant, context_serializer=without_secret)

    context = open_state(run)["context"]
    assert context["context"] == {"customer": "acme"}
    # Marked as the SDK marks what its own serializer made: only the deserializer rebuilds it.
    meta = context["context_meta"]
    assert (meta["serialized_via"], meta["requires_deserializer"]) == ("context_serializer", True)
    assert_secret_not_stored(run)


def test_sdk_state_of_mapping_context_holds_the_secret_without_our_checks():
    # Why pause_run must check: the SDK's own payload carries the application's secret.
    result = run_agent("release", PROMPT, context={"api_key": SECRET})

    payload = result.to_state().to_string(strict_context=True)

    assert SECRET in payload


def test_pause_run_registered_serializer_leaves_the_deploy_token_out():
    tenant = TenantFactory()
    result = run_agent("release", PROMPT, context={"deploy_token": SECRET, "team": "ops"})

    run = pause(result, tenant)

    assert open_state(run)["context"]["context"] == {"team": "ops"}
    assert_secret_not_stored(run)


def test_pause_run_without_serializer_keeps_mapping_context_as_is():
    tenant = TenantFactory()
    result = run_agent("invoice", "Publish test invoice INV-781", context={"team": "billing"})

    run = pause(result, tenant, agent_key="invoice")

    context = open_state(run)["context"]
    assert context["context"] == {"team": "billing"}
    assert context["context_meta"]["serialized_via"] == "mapping"


def test_pause_run_title_of_a_prompt_holding_a_secret_is_redacted():
    tenant = TenantFactory()

    run = paused_run(tenant, prompt=f"Deploy release 2026.07.24 with key {SECRET}")

    assert run.title == "[redacted]"
    assert SECRET not in json.dumps(list(AuditEvent.objects.values()), default=str)
