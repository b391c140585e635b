"""The agent registry: the setting and the approvals.agents entry points of installed packages,
together, with a clear refusal when a key is registered twice."""

from __future__ import annotations

from importlib import metadata

import pytest
from agents import Agent
from agents.run_state import CURRENT_SCHEMA_VERSION

from approvals.execution import registry
from approvals.models import RunExecutor

GROUP = "approvals.agents"
HERE = "tests.approvals.execution.test_registry"

# What a package's entry point names: version -> entry, as in the setting.
PACKAGED = {"1": f"{HERE}.build_agent", "2": {"factory": f"{HERE}.build_agent"}}
NOT_A_MAPPING = ["1"]


OTHER = {"1": f"{HERE}.build_agent"}


def build_agent() -> Agent:
    return Agent(name="packaged")


@pytest.fixture
def entry_points(monkeypatch):
    """Replace the installed entry points with the ones a test names; the registry's cache is
    forgotten before and after, so no other test sees them."""
    installed: list[metadata.EntryPoint] = []

    def fake(*, group: str):
        assert group == GROUP
        return [point for point in installed if point.group == group]

    monkeypatch.setattr(registry.metadata, "entry_points", fake)
    registry.forget()
    yield lambda name, value: installed.append(metadata.EntryPoint(name, value, GROUP))
    registry.forget()


def test_an_entry_point_registers_its_agent_versions(entry_points):
    entry_points("packaged", f"{HERE}:PACKAGED")

    one = registry.get_spec("packaged", "1")
    two = registry.get_spec("packaged", "2")

    assert (one.key, one.version, one.build().name) == ("packaged", "1", "packaged")
    assert two.factory is build_agent
    assert "packaged" in registry.agent_keys()
    assert "release" in registry.agent_keys()


def test_the_setting_and_the_entry_points_work_together(entry_points):
    entry_points("packaged", f"{HERE}:PACKAGED")

    assert registry.get_spec("release", "1").key == "release"
    assert registry.get_spec("packaged", "1").key == "packaged"


def test_a_key_in_the_setting_and_an_entry_point_is_refused_naming_both(entry_points):
    entry_points("release", f"{HERE}:PACKAGED")

    with pytest.raises(registry.AgentConflictError) as refused:
        registry.get_spec("release", "1")

    assert refused.value.status == 409
    assert refused.value.sentence() == (
        f"Agent 'release' is registered twice (APPROVALS_AGENTS and entry point release = "
        f"{HERE}:PACKAGED); remove one of them, the console will not guess which to run."
    )
    # The other agents are not affected.
    assert registry.get_spec("invoice", "1").key == "invoice"


def test_a_key_of_two_entry_points_is_refused(entry_points):
    entry_points("packaged", f"{HERE}:PACKAGED")
    entry_points("packaged", f"{HERE}:OTHER")

    with pytest.raises(registry.AgentConflictError, match="'packaged' is registered twice"):
        registry.get_spec("packaged", "1")


def test_a_conflict_blocks_a_run_of_that_agent_with_the_reason(entry_points):
    entry_points("release", f"{HERE}:PACKAGED")

    class StoredRun:
        schema_version = CURRENT_SCHEMA_VERSION
        agent_key, agent_version = "release", "1"
        executor = RunExecutor.CONSOLE

    assert registry.resume_blocker(StoredRun()).startswith("agent 'release' is registered twice")


def test_a_callers_run_has_no_resume_blocker_whatever_is_deployed(entry_points):
    """Its caller resumes it in its own program: nothing the console lacks stops approving it."""

    class CallerRun:
        schema_version = "0.0-unknown"
        agent_key, agent_version = "not-deployed-here", "7"
        executor = RunExecutor.CALLER

    assert registry.resume_blocker(CallerRun()) == ""


def test_an_entry_point_that_cannot_be_loaded_says_so(entry_points):
    entry_points("broken", "no_such_package_here:AGENTS")

    with pytest.raises(registry.UnknownAgentError) as refused:
        registry.get_spec("broken", "1")

    assert refused.value.sentence().startswith(
        "Agent 'broken': entry point broken = no_such_package_here:AGENTS cannot be loaded "
        "(ModuleNotFoundError: "
    )


def test_an_entry_point_that_is_not_a_mapping_says_so(entry_points):
    entry_points("listed", f"{HERE}:NOT_A_MAPPING")

    with pytest.raises(registry.UnknownAgentError) as refused:
        registry.get_spec("listed", "1")

    assert refused.value.sentence() == (
        f"Agent 'listed': entry point listed = {HERE}:NOT_A_MAPPING is not a mapping of "
        "version to factory."
    )


def test_the_entry_points_are_read_once_until_forgotten(entry_points):
    entry_points("packaged", f"{HERE}:PACKAGED")
    registry.get_spec("packaged", "1")
    entry_points("late", f"{HERE}:PACKAGED")

    with pytest.raises(registry.UnknownAgentError, match="'late' is not registered"):
        registry.get_spec("late", "1")
    registry.forget()

    assert registry.get_spec("late", "1").key == "late"


def test_the_tools_of_entry_point_agents_are_known_to_the_console():
    registry.forget()

    assert "deploy_release" in registry.tool_names()
    assert registry.tool_schema("release-pkg", "1", "deploy_release")["required"] == [
        "release",
        "environment",
    ]


def test_the_installed_example_package_registers_release_pkg():
    """The example package (examples/release-agent) installed beside the console, for real."""
    registry.forget()
    points = {p.name: p.value for p in metadata.entry_points(group=GROUP)}

    spec = registry.get_spec("release-pkg", "1")

    assert points["release-pkg"] == "release_agent:AGENTS"
    assert [tool.name for tool in spec.build().tools] == ["deploy_release"]


BUILT: list[str] = []


def build_counted_agent() -> Agent:
    BUILT.append("counted")
    return Agent(name="counted")


COUNTED = {"1": f"{HERE}.build_counted_agent", "2": f"{HERE}.build_counted_agent"}


def test_the_agent_to_load_with_is_built_once_per_version_and_a_run_builds_its_own(
    entry_points,
):
    entry_points("counted", f"{HERE}:COUNTED")
    BUILT.clear()

    first = registry.loading_agent("counted", "1")
    again = registry.loading_agent("counted", "1")
    other = registry.loading_agent("counted", "2")
    own = registry.get_spec("counted", "1").build()

    assert first is again
    assert other is not first
    assert own is not first
    assert len(BUILT) == 3
    registry.forget()
    assert registry.loading_agent("counted", "1") is not first
    assert len(BUILT) == 4


def test_an_agent_that_cannot_be_built_is_not_kept(entry_points, monkeypatch):
    entry_points("counted", f"{HERE}:COUNTED")
    broken = [True]

    def flaky() -> Agent:
        if broken[0]:
            raise RuntimeError("the factory failed")
        return Agent(name="counted")

    monkeypatch.setattr(f"{HERE}.build_counted_agent", flaky)

    with pytest.raises(RuntimeError, match="the factory failed"):
        registry.loading_agent("counted", "1")
    broken[0] = False

    assert registry.loading_agent("counted", "1").name == "counted"
    with pytest.raises(registry.UnknownAgentError):
        registry.loading_agent("missing", "1")
