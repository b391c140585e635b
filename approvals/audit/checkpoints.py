"""Signed checkpoints of the audit chains, to keep outside the database.

A checkpoint states, for each tenant, the head of its chain (the seq and hash of its last event)
at a time, signed with APPROVALS_AUDIT_SIGNING_KEY (Ed25519). The chain's key stops anyone who
lacks it from forging or altering an event; a checkpoint stops anyone from cutting the chain
below it, moving the head back, or rewriting it, unnoticed: `verify_audit --against` compares
each tenant's chain with it (docs/AUDIT.md).

The document (what `manage.py audit_checkpoint` writes):

    {"format": FORMAT, "public_key": <base64 raw Ed25519 public key>, "time": <ISO 8601>,
     "tenants": [{"statement": {"format", "tenant", "seq", "head", "time"},
                  "signature": <base64 Ed25519 of the statement's canonical JSON>}, ...],
     "signature": <base64 Ed25519 of the canonical JSON of everything above>}

Each tenant's statement is signed on its own, so that it can be handed to that tenant alone
(the audit.checkpoint webhook); the whole document is signed too, so that a tenant taken out
of the file is noticed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from django.db import transaction
from django.utils import timezone

from approvals import signals
from approvals.audit.chain import GENESIS, ChainReport, append, verify_chain
from approvals.core import signatures
from approvals.core.canonical import canonical_json
from approvals.models import AuditEvent, Tenant

FORMAT = "approvals-audit-checkpoint/1"
_HASH = re.compile(r"^[0-9a-f]{64}$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be trusted; the message says why, in one sentence."""


@dataclass(frozen=True)
class Statement:
    """One tenant's chain head at the time of a checkpoint: event #seq has hash head."""

    tenant: str
    seq: int
    head: str
    time: str

    def fields(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "tenant": self.tenant,
            "seq": self.seq,
            "head": self.head,
            "time": self.time,
        }


def _message(value: dict[str, Any]) -> bytes:
    return canonical_json(value).encode()


@dataclass(frozen=True)
class Checkpoint:
    """A signed checkpoint document, and the tenants left out because their chain is broken."""

    document: dict[str, Any]
    broken: list[ChainReport]

    def text(self) -> str:
        return json.dumps(self.document, indent=2, sort_keys=True) + "\n"


def take(tenants) -> Checkpoint:
    """Sign the head of each tenant's chain, once the chain up to it verifies.

    The head is read first and the chain verified up to it, so events appended meanwhile wait
    for the next checkpoint. A tenant whose chain is broken is left out (and reported): signing
    its head would vouch for the break. No side effects: record() audits the checkpoint.
    """
    time = timezone.now().astimezone(UTC).isoformat(timespec="seconds")
    entries = []
    broken = []
    for tenant in tenants:
        seq, head = Tenant.objects.values_list("audit_seq", "audit_head").get(pk=tenant.pk)
        head = head or GENESIS
        report = verify_chain(tenant, head=(seq, head))
        if not report.ok:
            broken.append(report)
            continue
        statement = Statement(tenant.slug, seq, head, time).fields()
        entries.append({"statement": statement, "signature": signatures.sign(_message(statement))})
    body = {
        "format": FORMAT,
        "public_key": signatures.public_key(),
        "time": time,
        "tenants": entries,
    }
    return Checkpoint({**body, "signature": signatures.sign(_message(body))}, broken)


def record(checkpoint: Checkpoint) -> list[AuditEvent]:
    """Audit a checkpoint once it is written, and offer each tenant its signed statement.

    Side effects: one audit.checkpointed event per tenant of the checkpoint, each in its own
    transaction; after each commits, signals.audit_checkpointed with the event and the tenant's
    signed statement (notifications delivers it to the tenant's webhooks).
    """
    public_key = checkpoint.document["public_key"]
    slugs = [entry["statement"]["tenant"] for entry in checkpoint.document["tenants"]]
    tenant_ids = dict(Tenant.objects.filter(slug__in=slugs).values_list("slug", "pk"))
    events = []
    for entry in checkpoint.document["tenants"]:
        statement = entry["statement"]
        with transaction.atomic():
            event = append(
                tenant_id=tenant_ids[statement["tenant"]],
                action="audit.checkpointed",
                outcome="checkpointed",
                detail={
                    "seq": statement["seq"],
                    "head": statement["head"],
                    "public_key": public_key,
                },
            )
            signals.send_on_commit(
                signals.audit_checkpointed,
                sender=AuditEvent,
                event=event,
                checkpoint={**entry, "public_key": public_key},
            )
        events.append(event)
    return events


def load(text: str, *, public_key: str) -> list[Statement]:
    """The statements of a checkpoint document signed by the key whose public key is given.

    Raises CheckpointError when the text is not a checkpoint, was signed by another key, or was
    changed after it was signed (its own signature or one tenant's does not verify).
    """
    try:
        document = json.loads(text)
    except ValueError:
        raise CheckpointError("the checkpoint is not JSON") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CheckpointError(f"the checkpoint is not a {FORMAT} document")
    if document.get("public_key") != public_key:
        raise CheckpointError(
            f"the checkpoint was signed by another key (public key {document.get('public_key')}, "
            f"expected {public_key})"
        )
    body = {k: v for k, v in document.items() if k != "signature"}
    try:
        signatures.verify(public_key, document.get("signature"), _message(body))
    except signatures.BadSignatureError:
        raise CheckpointError(
            "the checkpoint's signature does not verify: it was changed after it was signed"
        ) from None
    entries = document.get("tenants")
    if not isinstance(entries, list):
        raise CheckpointError("the checkpoint lists no tenants")
    return [_statement(entry, public_key) for entry in entries]


def _statement(entry: Any, public_key: str) -> Statement:
    fields = entry.get("statement") if isinstance(entry, dict) else None
    if not isinstance(fields, dict):
        raise CheckpointError("the checkpoint holds an entry without a statement")
    tenant = fields.get("tenant")
    try:
        signatures.verify(public_key, entry.get("signature"), _message(fields))
    except signatures.BadSignatureError:
        raise CheckpointError(
            f"the statement of tenant {tenant!r} does not verify: it was changed after it was "
            "signed"
        ) from None
    seq, head, time = fields.get("seq"), fields.get("head"), fields.get("time")
    if (
        fields.get("format") != FORMAT
        or not isinstance(tenant, str)
        or not isinstance(seq, int)
        or seq < 0
        or not isinstance(head, str)
        or not _HASH.match(head)
        or not isinstance(time, str)
    ):
        raise CheckpointError(f"the statement of tenant {tenant!r} is malformed")
    return Statement(tenant, seq, head, time)


def compare(statement: Statement) -> str | None:
    """What differs between the tenant's chain now and a checkpoint's statement, in one line
    naming the tenant; None when the chain still has that head at that seq.

    Pair it with verify_chain, which checks that the rest of the chain links up to its head.
    """
    when = f"the checkpoint of {statement.time}"
    tenant = Tenant.objects.filter(slug=statement.tenant).only("audit_seq").first()
    if tenant is None:
        return f"{statement.tenant}: in {when} at #{statement.seq}, but no such tenant now"
    if tenant.audit_seq < statement.seq:
        return (
            f"{statement.tenant}: the chain ends at #{tenant.audit_seq}, but {when} has it at "
            f"#{statement.seq}: events were cut"
        )
    if statement.seq == 0:
        return None
    event = AuditEvent.objects.filter(tenant=tenant, seq=statement.seq).only("hash").first()
    if event is None:
        return f"{statement.tenant}: event #{statement.seq} of {when} is missing"
    if event.hash != statement.head:
        return (
            f"{statement.tenant}: event #{statement.seq} has hash {event.hash[:16]}, but {when} "
            f"says {statement.head[:16]}: the chain was rewritten"
        )
    return None
