"""The release agent: a scripted model (deterministic, no API key) and one tool, deploy_release.

deploy_release needs an approval only when it deploys to production: its needs_approval is a
function of the call's arguments. The model's next step is a function of the conversation it is
given, because the console builds the agent afresh in each worker attempt; nothing may depend
on its position in memory.
"""

from __future__ import annotations

import json
import os
import re
import threading
from typing import Any

from agents import Agent, RunContextWrapper, function_tool
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext

from approvals.execution import ledger

# How often the model was asked, in this process (tests read it).
MODEL_CALLS = {"count": 0}
_lock = threading.Lock()
_STEPS = 10
RELEASE = re.compile(r"\b(\d{4}\.\d{2}\.\d{2})\b")


async def production_only(
    context: RunContextWrapper[Any], arguments: dict[str, Any], call_id: str
) -> bool:
    """Only a deploy to production waits for a person."""
    return arguments.get("environment") == "production"


def _record(release: str, environment: str) -> None:
    path = os.environ.get("RELEASE_AGENT_EFFECT_LOG")
    if not path:
        return
    line = json.dumps({"release": release, "environment": environment, "pid": os.getpid()})
    # O_APPEND keeps each line whole when several processes write.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@function_tool(needs_approval=production_only, failure_error_function=None)
def deploy_release(ctx: ToolContext, release: str, environment: str) -> str:
    """Deploy a release to an environment (staging or production)."""

    def effect() -> str:
        _record(release, environment)
        return f"Release {release} is live on {environment}."

    return ledger.perform(
        ctx.tool_call_id,
        operation="deploy_release",
        resource=f"{release}@{environment}",
        effect=effect,
    )


def _conversation(call_input: Any) -> tuple[str, dict[str, str]]:
    """The first user message, and each tool call's output by call id."""
    if isinstance(call_input, str):
        return call_input, {}
    prompt, outputs = "", {}
    for item in call_input:
        if not isinstance(item, dict):
            continue
        if not prompt and item.get("role") == "user" and isinstance(item.get("content"), str):
            prompt = item["content"]
        if item.get("type") == "function_call_output":
            outputs[item["call_id"]] = str(item.get("output"))
    return prompt, outputs


def _respond(call) -> list:
    with _lock:
        MODEL_CALLS["count"] += 1
    prompt, outputs = _conversation(call.input)
    found = RELEASE.search(prompt)
    if found is None:
        return [assistant_message("Which release should I deploy? Give it as YYYY.MM.DD.")]
    release = found.group(1)
    environment = "production" if "production" in prompt.lower() else "staging"
    call_id = f"call_deploy_{release}_{environment}"
    if call_id not in outputs:
        arguments = {"release": release, "environment": environment}
        return [function_call("deploy_release", arguments, call_id=call_id)]
    return [assistant_message(f"Release {release}: {outputs[call_id]}")]


def build_agent() -> Agent:
    return Agent(
        name="release-pkg",
        instructions=(
            "You deploy releases. Call deploy_release once for the environment the user names "
            "(staging when none is named), then report the outcome in one sentence."
        ),
        model=ScriptedModel([ModelStep.respond(_respond) for _ in range(_STEPS)]),
        tools=[deploy_release],
    )
