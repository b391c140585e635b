"""API tokens: issuing, checking, counting and revoking them.

A token reads `apc_<prefix>_<secret>`: the prefix (8 lowercase letters and digits) is stored and
shown; the secret (32 random bytes, URL-safe base64) is not. The row keeps the SHA-256 of the
whole token, so the token is shown once, when issued, and never again. The console page, the
commands and the API's authentication all go through this module.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
import string
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from api.models import ApiToken, Scope
from approvals import members
from approvals.audit import chain
from approvals.core import statements
from approvals.core.errors import ConflictError, DomainError
from approvals.models import Tenant

DEFAULT_DAYS = 90
MAX_DAYS = 365
MAX_NAME_CHARS = 100
PREFIX_ALPHABET = string.ascii_lowercase + string.digits
TOKEN_PATTERN = re.compile(r"apc_([a-z0-9]{8})_([A-Za-z0-9_-]{43})")
# The rate limit's and the usage count's windows: fixed minutes of the clock.
WINDOW_SECONDS = 60
# How long a window's request count stays in the cache: long enough to be reported by the
# token's next use (api.tokens.record_use) a while later.
COUNT_TTL_SECONDS = 24 * 3600
SCOPES: tuple[str, ...] = tuple(Scope.values)


class TokenRequestError(DomainError):
    """A token cannot be issued or revoked as asked; nothing was written."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class TokenAlreadyRevokedError(TokenRequestError, ConflictError):
    pass


class TokenRefusedError(DomainError):
    """The request's token does not authenticate it."""

    status = 401

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


class ScopeMissingError(DomainError):
    status = 403
    code = "scope_missing"


class RateLimitedError(DomainError):
    status = 429
    code = "rate_limited"

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"too many requests: try again in {retry_after} seconds")
        self.retry_after = retry_after


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    # The whole token: shown once, to whoever issued it, and stored nowhere.
    secret: str


def hash_token(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _when(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M} UTC"


def via(token: ApiToken) -> dict[str, str]:
    """What an audit event records about a change made over the API. The key is "prefix", not
    "token": the audit log masks anything under a key named like a secret."""
    return {"via": "api", "prefix": token.prefix}


def _check_person(tenant: Tenant, user, scopes: list[str]) -> None:
    if user is None:
        if Scope.TICKETS_DECIDE in scopes:
            raise TokenRequestError(
                "a token with tickets:decide acts as a person: choose who", field="user"
            )
        return
    membership = members.membership_for(user, tenant.pk)
    if membership is None:
        raise TokenRequestError(
            f"a token of {tenant.slug} cannot act as {user.get_username()}, who is not an "
            "active member of it",
            field="user",
        )
    if Scope.TICKETS_DECIDE in scopes and not membership.can_decide:
        raise TokenRequestError(
            f"a token acting as {user.get_username()} cannot have tickets:decide: they are a "
            f"{membership.role} of {tenant.slug}, who cannot decide tickets",
            field="user",
        )


def issue(
    *,
    tenant: Tenant,
    name: str,
    scopes: list[str],
    user=None,
    days: int = DEFAULT_DAYS,
    created_by=None,
    channel: str = "console",
) -> IssuedToken:
    """Create a token and return it with its secret, which is shown once and never stored.

    Side effects: the ApiToken row and an audit event token.created (detail: prefix, name,
    scopes, person, expiry, channel), in one transaction. Raises TokenRequestError (with the
    field at fault) for an empty or long name, no or unknown scopes, a lifetime outside 1 to
    MAX_DAYS days, a person who is not a member of the tenant, or tickets:decide without a
    person who may decide.
    """
    name = (name or "").strip()
    if not name:
        raise TokenRequestError("give the token a name", field="name")
    if len(name) > MAX_NAME_CHARS:
        raise TokenRequestError(
            f"the name is {len(name)} characters; at most {MAX_NAME_CHARS}", field="name"
        )
    scopes = sorted(set(scopes))
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown:
        raise TokenRequestError(
            f"unknown scope {', '.join(unknown)}; the scopes are {', '.join(SCOPES)}",
            field="scopes",
        )
    if not scopes:
        raise TokenRequestError("choose at least one scope", field="scopes")
    if not 1 <= days <= MAX_DAYS:
        raise TokenRequestError(f"a token lasts 1 to {MAX_DAYS} days, not {days}", field="days")
    _check_person(tenant, user, scopes)
    now = timezone.now()
    secret_part = secrets.token_urlsafe(32)
    with transaction.atomic():
        prefix = _free_prefix()
        text = f"apc_{prefix}_{secret_part}"
        token = ApiToken.objects.create(
            tenant=tenant,
            name=name,
            prefix=prefix,
            token_hash=hash_token(text),
            scopes=scopes,
            expires_at=now + timedelta(days=days),
            user=user,
            created_by=created_by,
            created_at=now,
        )
        chain.append(
            tenant_id=tenant.pk,
            action="token.created",
            actor=created_by,
            outcome="created",
            detail={
                "prefix": prefix,
                "name": name,
                "scopes": scopes,
                "user": user.get_username() if user is not None else None,
                "expires_at": token.expires_at.isoformat(),
                "via": channel,
            },
        )
    return IssuedToken(token, text)


def _free_prefix() -> str:
    while True:
        prefix = "".join(secrets.choice(PREFIX_ALPHABET) for _ in range(8))
        if not ApiToken.objects.filter(prefix=prefix).exists():
            return prefix


def revoke(token: ApiToken, *, by=None, channel: str = "console") -> ApiToken:
    """Revoke the token from now on.

    Side effects: revoked_at/revoked_by (one conditional UPDATE, so it is revoked once) and an
    audit event token.revoked, in one transaction. Raises TokenAlreadyRevokedError.
    """
    now = timezone.now()
    with transaction.atomic():
        won = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=now, revoked_by=by
        )
        token.refresh_from_db()
        if not won:
            raise TokenAlreadyRevokedError(f"token {token.prefix} was already {_revoked(token)}")
        chain.append(
            tenant_id=token.tenant_id,
            action="token.revoked",
            actor=by,
            outcome="revoked",
            detail={"prefix": token.prefix, "name": token.name, "via": channel},
        )
    return token


def _revoked(token: ApiToken) -> str:
    who = token.revoked_by.get_username() if token.revoked_by_id else "a command"
    return f"revoked on {_when(token.revoked_at)} by {who}"


def _with_tenant_and_person(values) -> QuerySet[ApiToken]:
    """The token of this prefix with its tenant, its person and whether that person is a
    member, as authenticate() reads it. Written once per process (core.statements): building
    it (the join and the member subquery) cost a third of authenticate()."""
    return (
        ApiToken.objects.select_related("tenant", "user")
        .annotate(person_is_member=members.has_membership())
        .filter(prefix=values["prefix"])
    )


MISSING = "send an API token in the header Authorization: Bearer apc_<prefix>_<secret>"


def authenticate(header: str | None) -> ApiToken:
    """The token an Authorization header carries, if it may be used now.

    Raises TokenRefusedError saying exactly why not: no or malformed header, unknown token,
    expired (when), revoked (when, by whom), or a person who is no longer a member. Reads the
    token with its tenant, its person and that person's membership in one query.
    """
    scheme, _, text = (header or "").strip().partition(" ")
    text = text.strip()
    if scheme.lower() != "bearer" or not text:
        raise TokenRefusedError(MISSING, code="token_missing")
    match = TOKEN_PATTERN.fullmatch(text)
    if match is None:
        raise TokenRefusedError(
            "that is not an API token: they read apc_<8 letters or digits>_<43 characters>",
            code="token_malformed",
        )
    # One query: the token, its tenant and person, and whether that person is still a member.
    # (Who revoked it is read only to say so.)
    try:
        token = statements.get(
            "api.tokens.authenticate", _with_tenant_and_person, {"prefix": match.group(1)}
        )
    except ApiToken.DoesNotExist:
        token = None
    # The hash is compared in constant time even when the prefix is unknown.
    stored = token.token_hash if token is not None else "0" * 64
    if not hmac.compare_digest(hash_token(text), stored) or token is None:
        raise TokenRefusedError("this API token is not known", code="token_unknown")
    if token.is_revoked:
        raise TokenRefusedError(f"this API token was {_revoked(token)}", code="token_revoked")
    if token.is_expired:
        raise TokenRefusedError(
            f"this API token expired on {_when(token.expires_at)}", code="token_expired"
        )
    if token.user_id is not None and not members.is_member(
        token.user, has_membership=token.person_is_member
    ):
        raise TokenRefusedError(
            f"this API token acts as {token.user.get_username()}, who is no longer an active "
            f"member of {token.tenant.slug}",
            code="token_person_gone",
        )
    return token


def require_scope(token: ApiToken, scope: str) -> None:
    """Raises ScopeMissingError unless the token has the scope."""
    if not token.has_scope(scope):
        raise ScopeMissingError(f"this API token lacks the scope {scope}")


def _window(moment: datetime) -> int:
    return int(moment.timestamp()) // WINDOW_SECONDS


def _count_key(token: ApiToken, window: int) -> str:
    return f"api:requests:{token.pk}:{window}"


def throttle(token: ApiToken, *, now: datetime | None = None) -> int:
    """Count a request of the token in the current minute and return the count.

    Fixed one-minute windows of the clock, counted in Django's cache (shared between processes
    when CACHES is Redis). Raises RateLimitedError, with the seconds left in the window, past
    APPROVALS_API_RATE_PER_MINUTE requests in a window (refused requests count too).
    """
    now = now or timezone.now()
    key = _count_key(token, _window(now))
    # Counting first: only the first request of a window finds no count and opens it.
    try:
        count = cache.incr(key)
    except ValueError:
        count = 1
        if not cache.add(key, count, timeout=COUNT_TTL_SECONDS):
            # Another request opened the window in between: count on from its number.
            try:
                count = cache.incr(key)
            except ValueError:
                # ...and the key expired at once: this request opens a fresh count.
                cache.set(key, count, timeout=COUNT_TTL_SECONDS)
    if count > settings.APPROVALS_API_RATE_PER_MINUTE:
        left = WINDOW_SECONDS - now.timestamp() % WINDOW_SECONDS
        raise RateLimitedError(max(1, math.ceil(left)))
    return count


def record_use(token: ApiToken, *, method: str, path: str, now: datetime | None = None) -> bool:
    """Note that the token was used: at most once per token per minute window.

    The first request of a token in a minute window of the clock writes last_used_at (one
    conditional UPDATE, so concurrent requests and processes write it once) and appends one
    audit event token.used; later requests in that window write nothing. The event's detail:
    the token's prefix, the window it opens, the first request's method and path, and the
    window last reported with its request count from the cache (null when the cache lost it).
    Returns whether this request wrote.
    """
    now = now or timezone.now()
    start = datetime.fromtimestamp(_window(now) * WINDOW_SECONDS, tz=UTC)
    previous = token.last_used_at
    if previous is not None and previous >= start:
        return False
    with transaction.atomic():
        won = (
            ApiToken.objects.filter(pk=token.pk)
            .filter(Q(last_used_at__isnull=True) | Q(last_used_at__lt=start))
            .update(last_used_at=now)
        )
        if not won:
            return False
        detail: dict[str, Any] = {
            **via(token),
            "window": start.isoformat(),
            "method": method,
            "path": path,
        }
        if previous is not None:
            detail["previous_window"] = datetime.fromtimestamp(
                _window(previous) * WINDOW_SECONDS, tz=UTC
            ).isoformat()
            detail["previous_requests"] = cache.get(_count_key(token, _window(previous)))
        chain.append(
            tenant_id=token.tenant_id,
            action="token.used",
            actor=token.user,
            actor_name="" if token.user_id else f"API token {token.prefix}",
            outcome="used",
            detail=detail,
        )
    token.last_used_at = now
    return True
