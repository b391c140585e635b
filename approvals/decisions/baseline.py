"""What a call is compared with: the last approved call of the same tool **for the same target**.

A deploy to staging is compared with the last approved deploy to staging, never with the last
one to production. Which arguments name the target:

1. the agent's registry entry, when it declares them for the tool (``"targets": {"deploy_release":
   ["environment"]}`` in ``APPROVALS_AGENTS``; an empty list says the tool has no target);
2. otherwise the arguments the call has among DEFAULT_TARGET_ARGUMENTS (environment, env,
   target, resource, account);
3. otherwise none: the last approved call of the tool in the tenant.

The ticket page, the edit page and anything else that shows such a diff call baseline_for(),
so they agree on one baseline ticket and show one diff.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from approvals.core import presenters
from approvals.core.canonical import canonical_json
from approvals.execution import registry
from approvals.models import Ticket, TicketStatus

DEFAULT_TARGET_ARGUMENTS = ("environment", "env", "target", "resource", "account")

# Approved calls of the tool read, newest first, to find one for the same target: a target's
# words are matched in the database first, so these are nearly always the right ones.
MAX_CANDIDATES = 50


@dataclass(frozen=True)
class Baseline:
    """The approved ticket a call is compared with, the target they share ({}: the tool has no
    target, any call of it compares), and what changed from it."""

    ticket: Ticket
    target: dict[str, Any]
    changes: list[presenters.Change]

    @property
    def target_text(self) -> str:
        return ", ".join(f"{name} {canonical_json(value)}" for name, value in self.target.items())


def target_arguments(
    *, agent_key: str, agent_version: str, tool_name: str, arguments: Any
) -> tuple[str, ...]:
    """The names of the arguments that identify what this call of the tool acts on.

    No side effects; no query. Raises nothing: an agent version that is not deployed here
    follows the default rule.
    """
    try:
        declared = registry.get_spec(agent_key, agent_version).targets
    except registry.UnknownAgentError:
        declared = {}
    if tool_name in declared:
        return declared[tool_name]
    if not isinstance(arguments, dict):
        return ()
    return tuple(name for name in DEFAULT_TARGET_ARGUMENTS if name in arguments)


_MISSING = object()


def _fragment(name: str, value: Any) -> str:
    # How the name and its value read inside canonical JSON (sorted keys, no spaces).
    return f"{canonical_json(name)}:{canonical_json(value)}"


def baseline_for(*, ticket: Ticket, arguments: Any) -> Baseline | None:
    """The last approved call of the ticket's tool in its tenant for the same target, with the
    diff from it to `arguments` (the call as shown); None when there is none.

    A decided ticket compares with what was approved before it was decided, as its deciders
    saw it. No side effects: one query, whatever the tenant's history.
    Raises nothing.
    """
    names = target_arguments(
        agent_key=ticket.run.agent_key,
        agent_version=ticket.run.agent_version,
        tool_name=ticket.tool_name,
        arguments=arguments,
    )
    target = {
        name: arguments.get(name, _MISSING) if isinstance(arguments, dict) else _MISSING
        for name in names
    }
    candidates = (
        Ticket.objects.filter(
            tenant_id=ticket.tenant_id, tool_name=ticket.tool_name, status=TicketStatus.APPROVED
        )
        .exclude(pk=ticket.pk)
        .select_related("decided_by")
        .order_by("-decided_at", "-pk")
    )
    if ticket.decided_at is not None:
        candidates = candidates.filter(decided_at__lt=ticket.decided_at)
    for name, value in target.items():
        if value is not _MISSING:
            candidates = candidates.filter(arguments_json__contains=_fragment(name, value))
    for candidate in candidates[:MAX_CANDIDATES]:
        before = json.loads(candidate.arguments_json)
        if not isinstance(before, dict) and target:
            continue
        if all(before.get(name, _MISSING) == value for name, value in target.items()):
            return Baseline(
                ticket=candidate,
                target={k: v for k, v in target.items() if v is not _MISSING},
                changes=presenters.diff(before, arguments),
            )
    return None
