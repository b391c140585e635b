"""Which code can honour a run: agent key -> version -> factory, from two places.

- settings.APPROVALS_AGENTS, and
- the Python entry points of group `approvals.agents` of the installed packages: the entry
  point's name is the agent key, its object a mapping version -> entry, so a team ships its
  agent as a package and installs it beside the console with no edit of the settings.

An entry is the dotted path of a factory with no required arguments that returns the
top-level agent, or a mapping with "factory" and optional "context_serializer" and
"context_deserializer" paths. The deserializer is where runtime dependencies (clients,
secrets from the environment) go back into the context at resume; they never sit in the blob.

A key is registered in one place only: a key both in the setting and in an entry point (or in
two packages' entry points) is a conflict, and that agent is refused with a sentence naming
both places (AgentConflictError) rather than one of them silently winning; the other agents are
not affected. The entry points are read once per process (installed packages do not change
while it runs); forget() clears that, and every cache of this module, for tests.

A mapping may also say which arguments of a tool name what it acts on: "targets", tool name ->
list of argument names (e.g. {"deploy_release": ["environment"]}). The ticket page compares a
call with the last approved call for the same target (decisions.baseline); a tool left out
follows the default rule there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from agents.run_state import CURRENT_SCHEMA_VERSION, SUPPORTED_SCHEMA_VERSIONS
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from approvals.core.errors import DomainError
from approvals.models import RunExecutor

ENTRY_POINT_GROUP = "approvals.agents"
SETTING = "APPROVALS_AGENTS"


class UnknownAgentError(DomainError, LookupError):
    """No deployed code for this agent key and version."""

    status = 400


class AgentConflictError(UnknownAgentError):
    """The agent key is registered in two places, so neither is used."""

    status = 409


@dataclass(frozen=True)
class AgentSpec:
    key: str
    version: str
    factory: Callable[[], Any]
    context_serializer: Callable[[Any], dict] | None = None
    context_deserializer: Callable[[dict], Any] | None = None
    # tool name -> the names of the arguments that identify what the call acts on
    targets: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def build(self):
        return self.factory()


@dataclass(frozen=True)
class _Source:
    """Where an agent key's versions come from, or why they cannot be read."""

    origin: str
    versions: Mapping[str, Any] | None = None
    problem: str = ""


def _load(path: str | None, what: str) -> Callable | None:
    if not path:
        return None
    try:
        return import_string(path)
    except ImportError as error:
        raise UnknownAgentError(f"{what} {path!r} cannot be imported: {error}") from None


@functools.cache
def _entry_point_sources() -> dict[str, tuple[_Source, ...]]:
    """The agents the installed packages register, by key; read once per process."""
    found: dict[str, list[_Source]] = {}
    seen: set[tuple[str, str, str]] = set()
    for point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        package = point.dist.name if point.dist is not None else ""
        if (point.name, point.value, package) in seen:
            continue
        seen.add((point.name, point.value, package))
        origin = f"entry point {point.name} = {point.value}" + (
            f" of package {package}" if package else ""
        )
        try:
            versions = point.load()
        except Exception as error:
            source = _Source(origin, problem=f"cannot be loaded ({type(error).__name__}: {error})")
        else:
            if isinstance(versions, Mapping):
                source = _Source(origin, versions={str(v): e for v, e in versions.items()})
            else:
                source = _Source(origin, problem="is not a mapping of version to factory")
        found.setdefault(point.name, []).append(source)
    return {key: tuple(sources) for key, sources in found.items()}


def _sources(agent_key: str) -> list[_Source]:
    sources = []
    if agent_key in settings.APPROVALS_AGENTS:
        sources.append(_Source(SETTING, versions=settings.APPROVALS_AGENTS[agent_key]))
    sources += _entry_point_sources().get(agent_key, ())
    return sources


def agent_keys() -> list[str]:
    """Every registered agent key, from the setting and the entry points."""
    return sorted(set(settings.APPROVALS_AGENTS) | set(_entry_point_sources()))


def versions_of(agent_key: str) -> Mapping[str, Any]:
    """The agent's versions -> entries. Raises UnknownAgentError (no such key, or its entry
    point cannot be loaded) or AgentConflictError (registered in two places)."""
    sources = _sources(agent_key)
    if not sources:
        raise UnknownAgentError(
            f"agent {agent_key!r} is not registered (neither in {SETTING} nor by an "
            f"{ENTRY_POINT_GROUP} entry point)"
        )
    if len(sources) > 1:
        raise AgentConflictError(
            f"agent {agent_key!r} is registered twice ({' and '.join(s.origin for s in sources)}); "
            "remove one of them, the console will not guess which to run"
        )
    source = sources[0]
    if source.versions is None:
        raise UnknownAgentError(f"agent {agent_key!r}: {source.origin} {source.problem}")
    return source.versions


def _targets(raw: Any, where: str) -> dict[str, tuple[str, ...]]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(
        isinstance(tool, str)
        and isinstance(names, list | tuple)
        and all(isinstance(name, str) and name for name in names)
        for tool, names in raw.items()
    ):
        raise UnknownAgentError(
            f"{where}: 'targets' must map tool names to lists of argument names"
        )
    return {tool: tuple(names) for tool, names in raw.items()}


def get_spec(agent_key: str, agent_version: str) -> AgentSpec:
    """The code of a deployed agent version. Raises UnknownAgentError (or AgentConflictError)."""
    versions = versions_of(agent_key)
    entry = versions.get(str(agent_version))
    if entry is None:
        known = ", ".join(sorted(versions)) or "none"
        raise UnknownAgentError(
            f"agent {agent_key!r} version {agent_version!r} is not deployed (deployed: {known})"
        )
    if isinstance(entry, str):
        entry = {"factory": entry}
    if not isinstance(entry, Mapping):
        raise UnknownAgentError(
            f"agent {agent_key!r} version {agent_version!r} is neither a factory path nor a "
            "mapping with a factory"
        )
    factory = _load(entry.get("factory"), "agent factory")
    if factory is None:
        raise UnknownAgentError(f"agent {agent_key!r} version {agent_version!r} has no factory")
    return AgentSpec(
        key=agent_key,
        version=str(agent_version),
        factory=factory,
        context_serializer=_load(entry.get("context_serializer"), "context serializer"),
        context_deserializer=_load(entry.get("context_deserializer"), "context deserializer"),
        targets=_targets(entry.get("targets"), f"agent {agent_key!r} version {agent_version!r}"),
    )


def unsupported_schema(version: str) -> str:
    """Why this SDK cannot load a state of this $schemaVersion; "" when it can."""
    if version in SUPPORTED_SCHEMA_VERSIONS:
        return ""
    return (
        f"the state was written in SDK schema {version!r}, which this "
        f"SDK (schema {CURRENT_SCHEMA_VERSION}) cannot load"
    )


def resume_blocker(run: Any) -> str:
    """Why this console cannot resume the run, whatever is decided: its state's SDK schema
    cannot be loaded, or its agent version is not deployed here; "" when it can. A run its
    caller holds resumes in the caller's program, which this console need not have: "".

    The worker refuses such a run (runs.checks.check_before_resume); the queue, the ticket and
    the edit page warn before anyone approves. No database query: the run's own fields and
    the settings.
    """
    if run.executor == RunExecutor.CALLER:
        return ""
    unsupported = unsupported_schema(run.schema_version)
    if unsupported:
        return unsupported
    try:
        get_spec(run.agent_key, run.agent_version)
    except UnknownAgentError as error:
        return str(error)
    return ""


@functools.cache
def tool_names() -> tuple[str, ...]:
    """Every tool name of every deployed agent version, found once per process.

    A deployed version never changes its tools, so the queue can offer them as filters without
    scanning tickets.
    """
    names: set[str] = set()
    for key in agent_keys():
        try:
            versions = versions_of(key)
        except UnknownAgentError:
            continue
        for version in versions:
            try:
                agent = get_spec(key, version).build()
            except Exception:
                continue
            stack, seen = [agent], set()
            while stack:
                current = stack.pop()
                if id(current) in seen:
                    continue
                seen.add(id(current))
                names.update(
                    t.name for t in getattr(current, "tools", []) if getattr(t, "name", None)
                )
                stack.extend(h for h in getattr(current, "handoffs", []) if hasattr(h, "tools"))
    return tuple(sorted(names))


def find_tool(agent: Any, tool_name: str) -> Any | None:
    """The function tool called tool_name in the agent or any agent it hands off to."""
    stack, seen = [agent], set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        for tool in getattr(current, "tools", []) or []:
            names = {getattr(tool, "name", None), getattr(tool, "qualified_name", None)}
            if tool_name in names and isinstance(getattr(tool, "params_json_schema", None), dict):
                return tool
        for handoff in getattr(current, "handoffs", []) or []:
            target = handoff if hasattr(handoff, "tools") else getattr(handoff, "agent", None)
            if target is not None:
                stack.append(target)
    return None


@functools.cache
def loading_agent(agent_key: str, agent_version: str) -> Any:
    """The deployed version's agent built once per process, to read with and never to run:
    loading a state with RunState.from_json (runs.remote checks a caller's state so) reads the
    agent and changes nothing of it. A run builds its own with AgentSpec.build(): its tools and
    hooks may keep state. Raises what get_spec() or the factory raise (and keeps nothing)."""
    return get_spec(agent_key, agent_version).build()


@functools.cache
def tool_schema(agent_key: str, agent_version: str, tool_name: str) -> dict | None:
    """The parameters schema of the deployed version's function tool, found once per process (a
    deployed version never changes its tools); None when the version or the tool is missing."""
    try:
        agent = get_spec(agent_key, agent_version).build()
    except Exception:
        return None
    tool = find_tool(agent, tool_name)
    return tool.params_json_schema if tool is not None else None


def forget() -> None:
    """Read the entry points again and forget every tool found: deployed versions never change
    while a process runs, except in a test that changes them."""
    _entry_point_sources.cache_clear()
    tool_names.cache_clear()
    tool_schema.cache_clear()
    loading_agent.cache_clear()


@receiver(setting_changed)
def _forget_agents(*, setting: str, **kwargs) -> None:
    if setting == SETTING:
        forget()
