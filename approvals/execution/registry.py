"""Which code can honour a run: settings.APPROVALS_AGENTS maps agent key -> version -> factory.

An entry is the dotted path of a factory with no required arguments that returns the
top-level agent, or a mapping with "factory" and optional "context_serializer" and
"context_deserializer" paths. The deserializer is where runtime dependencies (clients,
secrets from the environment) go back into the context at resume; they never sit in the blob.

A mapping may also say which arguments of a tool name what it acts on: "targets", tool name ->
list of argument names (e.g. {"deploy_release": ["environment"]}). The ticket page compares a
call with the last approved call for the same target (decisions.baseline); a tool left out
follows the default rule there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agents.run_state import CURRENT_SCHEMA_VERSION, SUPPORTED_SCHEMA_VERSIONS
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string


class UnknownAgentError(LookupError):
    pass


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


def _load(path: str | None, what: str) -> Callable | None:
    if not path:
        return None
    try:
        return import_string(path)
    except ImportError as error:
        raise UnknownAgentError(f"{what} {path!r} cannot be imported: {error}") from None


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
    versions = settings.APPROVALS_AGENTS.get(agent_key)
    if versions is None:
        raise UnknownAgentError(f"agent {agent_key!r} is not registered in APPROVALS_AGENTS")
    entry = versions.get(str(agent_version))
    if entry is None:
        known = ", ".join(sorted(versions)) or "none"
        raise UnknownAgentError(
            f"agent {agent_key!r} version {agent_version!r} is not deployed (deployed: {known})"
        )
    if isinstance(entry, str):
        entry = {"factory": entry}
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
    cannot be loaded, or its agent version is not deployed here; "" when it can.

    The worker refuses such a run (runs.checks.check_before_resume); the queue, the ticket and
    the edit page warn before anyone approves. No database query: the run's own fields and
    the settings.
    """
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
    for key, versions in settings.APPROVALS_AGENTS.items():
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
def tool_schema(agent_key: str, agent_version: str, tool_name: str) -> dict | None:
    """The parameters schema of the deployed version's function tool, found once per process (a
    deployed version never changes its tools); None when the version or the tool is missing."""
    try:
        agent = get_spec(agent_key, agent_version).build()
    except Exception:
        return None
    tool = find_tool(agent, tool_name)
    return tool.params_json_schema if tool is not None else None


@receiver(setting_changed)
def _forget_agents(*, setting: str, **kwargs) -> None:
    # Deployed versions never change, except when a test changes the setting itself.
    if setting == "APPROVALS_AGENTS":
        tool_names.cache_clear()
        tool_schema.cache_clear()
