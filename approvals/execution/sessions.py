"""The conversation session a run must resume with: how it is recorded, how it is reopened.

A run records the backend, the session id and a location (a SQLite file, a Redis key prefix);
never a URL with credentials: connection settings come from the environment at resume.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from agents.extensions.memory import RedisSession
from agents.memory import OpenAIConversationsSession, SQLiteSession
from django.conf import settings
from django.utils.module_loading import import_string
from openai import AsyncOpenAI


class UnsupportedSessionError(ValueError):
    pass


@dataclass(frozen=True)
class SessionRef:
    backend: str = ""
    session_id: str = ""
    location: str = ""


NO_SESSION = SessionRef()


def describe(session) -> SessionRef:
    """How to find this session again from another process."""
    if session is None:
        return NO_SESSION
    if isinstance(session, SQLiteSession):
        path = str(session.db_path)
        if path == ":memory:":
            raise UnsupportedSessionError(
                "an in-memory SQLiteSession cannot be resumed from another process"
            )
        return SessionRef("sqlite", session.session_id, str(Path(path).resolve()))
    if isinstance(session, OpenAIConversationsSession):
        try:
            conversation_id = session.session_id
        except ValueError:
            raise UnsupportedSessionError(
                "the OpenAI conversation has not been created yet; run at least one turn first"
            ) from None
        return SessionRef("openai_conversations", conversation_id)
    if isinstance(session, RedisSession):
        return SessionRef("redis", session.session_id, session._key_prefix)
    describe_self = getattr(session, "describe_for_console", None)
    if callable(describe_self):
        backend, session_id, location = describe_self()
        return SessionRef(backend, session_id, location)
    raise UnsupportedSessionError(f"sessions of type {type(session).__name__} cannot be resumed")


def openai_client():
    """The client for the Conversations API: the SDK's default, or one for OPENAI_BASE_URL."""
    if not settings.APPROVALS_OPENAI_BASE_URL:
        return None
    return AsyncOpenAI(
        api_key=settings.OPENAI_API_KEY or "not-needed", base_url=settings.APPROVALS_OPENAI_BASE_URL
    )


def _open_custom(ref: SessionRef):
    openers = settings.APPROVALS_SESSION_OPENERS
    path = openers.get(ref.backend)
    if path is None:
        raise UnsupportedSessionError(f"no session backend named {ref.backend!r} is configured")
    return import_string(path)(ref.session_id, ref.location)


@asynccontextmanager
async def reopen(ref: SessionRef) -> AsyncIterator[object | None]:
    """The run's session, opened again; closed afterwards when this process owns it."""
    if not ref.backend:
        yield None
        return
    if ref.backend == "sqlite":
        session = SQLiteSession(ref.session_id, ref.location)
        try:
            yield session
        finally:
            session.close()
        return
    if ref.backend == "redis":
        if not settings.REDIS_URL:
            raise UnsupportedSessionError("the run's session is in Redis but REDIS_URL is not set")
        session = RedisSession.from_url(
            ref.session_id, url=settings.REDIS_URL, key_prefix=ref.location
        )
        try:
            yield session
        finally:
            # from_url made the client, so this process owns it and must close it.
            await session.close()
        return
    if ref.backend == "openai_conversations":
        client = openai_client()
        try:
            yield OpenAIConversationsSession(conversation_id=ref.session_id, openai_client=client)
        finally:
            # Only a client made here is closed; the SDK's default client is shared.
            if client is not None:
                await client.close()
        return
    yield _open_custom(ref)
