"""Demo agents: a release agent and an invoice agent, each with one tool that needs approval.

Without OPENAI_API_KEY they run on a scripted model that decides its next step from the
conversation it is given (each resume builds the agent afresh in the worker, so nothing can
depend on in-memory position). With a key they run on a real model.
Their side effects go through the idempotency ledger and are appended to a log file, which
tests read to count what really happened.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any

from agents import Agent, function_tool
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext
from django.conf import settings

from approvals.decisions import edit
from approvals.execution import ledger

# Counted per process, for tests that assert how often the model was asked.
MODEL_CALLS = {"release": 0, "invoice": 0}
_counter_lock = threading.Lock()
_SCRIPT_STEPS = 20


def record_effect(**fields: Any) -> None:
    """Append one line per real side effect; O_APPEND keeps lines whole across processes."""
    path = Path(settings.APPROVALS_DEMO_EFFECT_LOG)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({**fields, "pid": os.getpid()}, sort_keys=True) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_effects(operation: str | None = None) -> list[dict]:
    path = Path(settings.APPROVALS_DEMO_EFFECT_LOG)
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if operation is None or r.get("op") == operation]


# --- tools --------------------------------------------------------------------------------------


def release_context_serializer(context: dict) -> dict:
    """What of the release agent's context may be stored: everything but the deploy token."""
    return {key: value for key, value in context.items() if key != "deploy_token"}


def release_context_deserializer(data: dict) -> dict:
    """Back at resume: the deploy token comes from this process's environment, never the blob."""
    return {**data, "deploy_token": os.environ.get("RELEASE_DEPLOY_TOKEN", "")}


@function_tool(needs_approval=True, failure_error_function=None)
def deploy_release(ctx: ToolContext, release: str, environment: str) -> str:
    """Deploy a release to an environment (staging or production)."""
    context = ctx.context if isinstance(ctx.context, dict) else {}

    def effect() -> str:
        record_effect(
            op="deploy_release",
            release=release,
            environment=environment,
            authenticated=bool(context.get("deploy_token")),
        )
        return f"Release {release} is live on {environment}."

    return ledger.perform(
        ctx.tool_call_id,
        operation="deploy_release",
        resource=f"{release}@{environment}",
        effect=effect,
    )


@function_tool(needs_approval=True, failure_error_function=None)
def publish_invoice(ctx: ToolContext, invoice_id: str) -> str:
    """Publish an invoice to the customer."""

    def effect() -> str:
        record_effect(op="publish_invoice", invoice_id=invoice_id)
        return f"Invoice {invoice_id} was published."

    return ledger.perform(
        ctx.tool_call_id, operation="publish_invoice", resource=invoice_id, effect=effect
    )


# --- the scripted model ---------------------------------------------------------------------


def _conversation(call_input: Any) -> tuple[str, dict[str, str]]:
    """The first user message, and each tool call's output by call id."""
    if isinstance(call_input, str):
        return call_input, {}
    prompt = ""
    outputs: dict[str, str] = {}
    for item in call_input:
        if not isinstance(item, dict):
            continue
        if not prompt and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                prompt = content
            elif isinstance(content, list):
                prompt = " ".join(
                    part.get("text", "") for part in content if isinstance(part, dict)
                )
        if item.get("type") == "function_call_output":
            outputs[item["call_id"]] = str(item.get("output"))
    return prompt, outputs


def _count(agent_key: str) -> None:
    with _counter_lock:
        MODEL_CALLS[agent_key] += 1


def _latest_call(call_id: str, tool: str, outputs: dict[str, str]) -> tuple[str, dict | None]:
    """The call that stands for call_id now, and its arguments when an approver changed them.

    A rejection whose message carries corrected arguments for this tool asks for a new call
    with exactly those arguments; each such call has its own id, derived from the one it
    replaces, so the script stays a function of the conversation alone.
    """
    arguments = None
    while call_id in outputs:
        correction = edit.parse_correction(outputs[call_id])
        if correction is None or correction.tool != tool:
            break
        call_id, arguments = f"{call_id}_edited", correction.arguments
    return call_id, arguments


def _release_responder(call) -> list:
    _count("release")
    prompt, outputs = _conversation(call.input)
    match = re.search(r"\b(\d{4}\.\d{2}\.\d{2}(?:[.-]\w+)?)\b", prompt)
    if match is None:
        return [assistant_message("Which release should I deploy? Give it as YYYY.MM.DD.")]
    release = match.group(1)
    environments = [e for e in ("staging", "production") if e in prompt.lower()] or ["production"]
    latest = {}
    deployed: list[str] = []
    for environment in environments:
        call_id, corrected = _latest_call(
            f"call_deploy_{release}_{environment}", "deploy_release", outputs
        )
        if call_id not in outputs:
            arguments = corrected or {"release": release, "environment": environment}
            return [function_call("deploy_release", arguments, call_id=call_id)]
        latest[environment] = call_id
        # An approver's edit changed what was deployed: the report names that release.
        edited = corrected.get("release") if corrected else None
        name = edited if isinstance(edited, str) else release
        if name not in deployed:
            deployed.append(name)
    summary = " ".join(outputs[latest[e]] for e in environments)
    return [assistant_message(f"Release {', '.join(deployed)}: {summary}")]


def _invoice_responder(call) -> list:
    _count("invoice")
    prompt, outputs = _conversation(call.input)
    match = re.search(r"\bINV-\d+\b", prompt)
    if match is None:
        return [assistant_message("Which invoice should I publish?")]
    call_id, corrected = _latest_call(f"call_publish_{match.group(0)}", "publish_invoice", outputs)
    if call_id not in outputs:
        arguments = corrected or {"invoice_id": match.group(0)}
        return [function_call("publish_invoice", arguments, call_id=call_id)]
    return [assistant_message(f"Invoice {match.group(0)}: {outputs[call_id]}")]


def _model(responder):
    if settings.OPENAI_API_KEY:
        return settings.APPROVALS_OPENAI_MODEL
    return ScriptedModel([ModelStep.respond(responder) for _ in range(_SCRIPT_STEPS)])


def build_release_agent() -> Agent:
    return Agent(
        name="release",
        instructions=(
            "You deploy releases. Call deploy_release once per environment the user names "
            "(production when none is named), then report the outcome in one sentence. "
            "If a deployment is refused, say so and do not retry, unless the refusal gives you "
            "corrected arguments: then call the tool once more with exactly those arguments."
        ),
        model=_model(_release_responder),
        tools=[deploy_release],
    )


def build_invoice_agent() -> Agent:
    return Agent(
        name="invoice",
        instructions=(
            "You publish invoices. Call publish_invoice for the invoice the user names, then "
            "report the outcome in one sentence. If publishing is refused, say so; if the refusal "
            "gives you corrected arguments, call the tool once more with exactly those."
        ),
        model=_model(_invoice_responder),
        tools=[publish_invoice],
    )
