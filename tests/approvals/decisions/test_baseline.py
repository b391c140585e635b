"""Which arguments name a call's target: the agent's registry entry, else the default names."""

from __future__ import annotations

import copy

import pytest

from approvals.decisions.baseline import target_arguments
from approvals.execution import registry


def targets(tool: str, arguments, *, agent: str = "release", version: str = "1"):
    return target_arguments(
        agent_key=agent, agent_version=version, tool_name=tool, arguments=arguments
    )


def test_baseline_target_is_what_the_registry_declares():
    assert targets("deploy_release", {"release": "1", "environment": "x"}) == ("environment",)
    assert targets("publish_invoice", {"invoice_id": "INV-1"}, agent="invoice") == ()


def test_baseline_target_defaults_to_the_usual_argument_names(settings):
    agents = copy.deepcopy(settings.APPROVALS_AGENTS)
    del agents["release"]["1"]["targets"]
    settings.APPROVALS_AGENTS = agents

    assert targets("deploy_release", {"env": "a", "account": "b", "release": "c"}) == (
        "env",
        "account",
    )
    assert targets("deploy_release", {"release": "c"}) == ()


def test_baseline_target_of_an_agent_not_deployed_follows_the_default():
    assert targets("anything", {"resource": "db-1"}, agent="gone") == ("resource",)
    assert targets("anything", ["not", "an", "object"], agent="gone") == ()


def test_registry_reads_targets_from_the_entry():
    spec = registry.get_spec("release", "1")

    assert spec.targets == {"deploy_release": ("environment",)}


@pytest.mark.parametrize("bad", [["environment"], {"deploy_release": "environment"}, {"t": [""]}])
def test_registry_refuses_targets_that_are_not_tool_to_argument_names(settings, bad):
    agents = copy.deepcopy(settings.APPROVALS_AGENTS)
    agents["release"]["1"]["targets"] = bad
    settings.APPROVALS_AGENTS = agents

    with pytest.raises(registry.UnknownAgentError, match="'targets' must map tool names"):
        registry.get_spec("release", "1")
