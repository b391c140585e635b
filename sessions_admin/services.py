"""Clearing and purging agent conversation sessions; every cleared session is audited."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import transaction

from approvals.audit import chain
from approvals.models import Tenant
from sessions_admin.stores import Filters, SessionInfo, StoreUnavailable, get_store, list_sessions

SAMPLE = 10


def clear_session(
    *, store_name: str, tenant: Tenant, session_id: str, actor=None, actor_name: str = ""
) -> int:
    """Delete one session's history in its store.

    Side effects: the store's rows or keys for the session; audit event session.cleared
    (store, session id, item count, who) in the tenant's chain. Raises SessionMissing or
    StoreUnavailable, having cleared nothing.
    """
    store = get_store(store_name)
    count = store.clear(tenant, session_id)
    with transaction.atomic():
        chain.append(
            tenant_id=tenant.pk,
            action="session.cleared",
            actor=actor,
            actor_name=actor_name,
            outcome="cleared",
            detail={"store": store_name, "session_id": session_id[:255], "items": count},
        )
    return count


@dataclass
class StorePlan:
    store: str
    sessions: list[SessionInfo] = field(default_factory=list)
    error: str = ""

    @property
    def items(self) -> int:
        return sum(s.items or 0 for s in self.sessions)

    @property
    def sample(self) -> list[str]:
        return [f"{s.tenant.slug}/{s.session_id}" for s in self.sessions[:SAMPLE]]


@dataclass
class PurgePlan:
    stores: list[StorePlan]

    @property
    def count(self) -> int:
        return sum(len(p.sessions) for p in self.stores)

    @property
    def errors(self) -> dict[str, str]:
        return {p.store: p.error for p in self.stores if p.error}


def plan_purge(*, store_names: list[str], filters: Filters) -> PurgePlan:
    """What a purge with these filters would clear: a dry run, which changes nothing."""
    plans = []
    for name in store_names:
        listing = list_sessions(filters, [get_store(name)])
        plans.append(StorePlan(name, listing.sessions, listing.errors.get(name, "")))
    return PurgePlan(plans)


@dataclass
class PurgeResult:
    cleared: list[tuple[str, str, str, int]] = field(default_factory=list)
    failed: list[tuple[str, str, str]] = field(default_factory=list)


def purge(*, plan: PurgePlan, actor=None, actor_name: str = "") -> PurgeResult:
    """Clear every session of a plan. Only the sessions the plan lists are touched.

    Side effects: as clear_session for each; a session that vanished or whose store failed
    is reported, and the others still go ahead.
    """
    result = PurgeResult()
    for store_plan in plan.stores:
        for info in store_plan.sessions:
            try:
                count = clear_session(
                    store_name=store_plan.store,
                    tenant=info.tenant,
                    session_id=info.session_id,
                    actor=actor,
                    actor_name=actor_name,
                )
            except (StoreUnavailable, LookupError) as error:
                result.failed.append(
                    (store_plan.store, info.tenant.slug, f"{info.session_id}: {error}")
                )
                continue
            result.cleared.append((store_plan.store, info.tenant.slug, info.session_id, count))
    return result
