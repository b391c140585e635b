"""Signed decisions: the caller's side of docs/API.md, with a real SDK run paused on its own tool.

Every scenario runs with the sync and the async client. A refused decision leaves the caller's
state as it was and its tool unrun; an accepted one runs the approved tool exactly once.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from agents import Runner
from approvals_client import DecisionRefused, arguments_digest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from approvals.core import canonical
from tests.clients.conftest import PRODUCTION, STAGING, caller_agent, sign

# --- the arguments digest is the console's ------------------------------------------------------


def _outcome(digest, raw):
    try:
        return "ok", digest(raw)
    except Exception as error:
        return "error", type(error).__name__


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@st.composite
def objects_with_duplicate_keys(draw):
    key = draw(st.text(max_size=5))
    pairs = [(key, draw(json_values)), *draw(st.lists(st.tuples(st.text(), json_values))), (key, 1)]
    body = ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in pairs)
    nested = draw(st.booleans())
    return f'{{"outer":{{{body}}}}}' if nested else f"{{{body}}}"


argument_texts = st.one_of(
    st.none(),
    st.just(""),
    st.text(),
    json_values.map(json.dumps),
    st.builds(
        lambda value, ascii_only, indent: json.dumps(value, ensure_ascii=ascii_only, indent=indent),
        json_values,
        st.booleans(),
        st.sampled_from([None, 2]),
    ),
    objects_with_duplicate_keys(),
    st.sampled_from(
        [
            '{"a": NaN}',
            '{"a": 1e400}',
            '{"s": "\\ud800"}',
            '{"k": "caf\\u00e9", "k2": "café", "z": "\u202e\u200b"}',
            "[" * 5000 + "]" * 5000,
            '{"a":1} trailing',
            "  {}  ",
        ]
    ),
)


@settings(max_examples=400, deadline=None)
@given(argument_texts)
def test_arguments_digest_equals_the_consoles(raw):
    assert _outcome(arguments_digest, raw) == _outcome(canonical.arguments_digest, raw)


def test_arguments_digest_unparsed_and_duplicate_keys_are_kept_verbatim():
    # Both parse to {"a": 2} under a lenient parser; the digest must tell them apart.
    assert arguments_digest('{"a":1,"a":2}') != arguments_digest('{"a":2}')
    assert arguments_digest("not json") == canonical.sha256_hex('{"__unparsed__":"not json"}')
    assert arguments_digest("") == arguments_digest(None) == canonical.sha256_hex("{}")


# --- scenarios ----------------------------------------------------------------------------------


async def hand_over(client, console, *turns, decide=None, tamper=None):
    """Run the caller's agent to its pause, submit it, have people decide, wait for the
    decisions. Returns (the caller's agent, its own state, the Run it holds, the decided Run)."""
    caller = caller_agent(*turns)
    result = await Runner.run(caller.agent, "Deploy")
    held = await client.submit_pause(result, agent="release", version="1", title="Deploy")
    console.decide(held.id, decide or {call_id: ("approve", "") for call_id, _ in turns[0]})
    if tamper:
        tamper(console.runs[held.id])
    decided = await client.wait_for_decisions(held.id, timeout=5)
    return caller, result.to_state(), held, decided


async def assert_refused(client, caller, state, held, decided, reason: str) -> None:
    before = state.to_json()
    with pytest.raises(DecisionRefused, match=reason):
        await client.apply_decisions(state, held, decided.decisions)
    assert state.to_json() == before
    # Run again as it stands, the state still asks for the same approvals and nothing runs.
    again = await Runner.run(caller.agent, state)
    assert caller.executions == []
    assert [i.call_id for i in again.interruptions] == [
        i.call_id for i in state.get_interruptions()
    ]


def resign(console, **changes):
    """A tamper that re-signs the run's first decision, with the console's own key, after
    changing these payload fields: a signature that verifies on a decision that must not."""

    def tamper(run):
        key_id = next(iter(console.keys))
        signed = run["decisions"][0]
        run["decisions"][0] = sign(signed["payload"] | changes, console.keys[key_id], key_id)

    return tamper


def test_apply_approval_runs_the_tool_exactly_once_and_reports(client, console):
    async def scenario():
        caller, state, held, decided = await hand_over(client, console, [("call_1", STAGING)])
        assert (decided.status, len(decided.decisions)) == ("awaiting_caller", 1)
        applied = await client.apply_decisions(state, held, decided.decisions)
        assert [d.payload.call_id for d in applied.approved] == ["call_1"]
        assert applied.rejected == ()
        result = await Runner.run(caller.agent, applied.state)
        assert caller.executions == [STAGING]
        finished = await client.report(held, result)
        assert finished.status == "completed"
        assert console.outcomes == [{"status": "completed", "output": "done"}]

    asyncio.run(scenario())


def test_apply_rejection_never_runs_the_tool_and_the_model_reads_why(client, console):
    async def scenario():
        caller, state, held, decided = await hand_over(
            client, console, [("call_1", STAGING)], decide={"call_1": ("reject", "Not today.")}
        )
        applied = await client.apply_decisions(state, decided)
        assert [d.payload.message for d in applied.rejected] == ["Not today."]
        result = await Runner.run(caller.agent, state)
        assert caller.executions == []
        assert result.final_output == "done"
        told = [i for i in caller.model.last_call.input if i.get("type") == "function_call_output"]
        assert [(i["call_id"], i["output"]) for i in told] == [("call_1", "Not today.")]

    asyncio.run(scenario())


def test_apply_two_calls_one_approved_one_rejected(client, console):
    async def scenario():
        caller, state, held, decided = await hand_over(
            client,
            console,
            [("call_1", STAGING), ("call_2", PRODUCTION)],
            decide={"call_1": ("approve", ""), "call_2": ("reject", "Staging first.")},
        )
        await client.apply_decisions(state, held, decided.decisions)
        await Runner.run(caller.agent, state)
        assert caller.executions == [STAGING]

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        pytest.param(
            lambda console: lambda run: run["decisions"][0]["payload"].update(decision="reject"),
            "signature of the decision on call 'call_1' does not verify",
            id="flipped-decision",
        ),
        pytest.param(
            lambda console: resign(
                console, arguments_digest=canonical.arguments_digest(json.dumps(PRODUCTION))
            ),
            "other arguments than those in this state",
            id="other-digest",
        ),
        pytest.param(
            lambda console: resign(console, run=4242), "is for run 4242, not run 42", id="other-run"
        ),
        pytest.param(
            lambda console: resign(console, tenant="globex"),
            "is for tenant 'globex', not 'acme'",
            id="other-tenant",
        ),
        pytest.param(
            lambda console: resign(console, call_id="call_9"),
            "names no interruption of this state",
            id="other-call",
        ),
        pytest.param(
            lambda console: resign(console, tool_name="publish_invoice"),
            "is about tool 'publish_invoice'",
            id="other-tool",
        ),
        pytest.param(
            lambda console: lambda run: run["decisions"].append(run["decisions"][0]),
            "call 'call_1' has more than one decision",
            id="twice",
        ),
    ],
)
def test_apply_refuses_a_decision_that_is_not_this_ones(client, console, tamper, reason):
    async def scenario():
        found = await hand_over(client, console, [("call_1", STAGING)], tamper=tamper(console))
        await assert_refused(client, *found, reason)

    asyncio.run(scenario())


def test_apply_refuses_an_older_generation(client, console):
    async def scenario():
        caller, state, held, decided = await hand_over(
            client, console, [("call_1", STAGING)], [("call_2", PRODUCTION)]
        )
        await client.apply_decisions(state, held, decided.decisions)
        second = await Runner.run(caller.agent, state)
        assert caller.executions == [STAGING]
        held = await client.report(held, second)
        assert (held.status, held.generation) == ("paused", 2)
        console.decide(held.id, {"call_2": ("approve", "")})
        # A generation-1 decision on the very same call and arguments: only the binding differs.
        resign(console, generation=1)(console.runs[held.id])
        decided = await client.wait_for_decisions(held.id, timeout=5)
        caller.executions.clear()
        await assert_refused(
            client, caller, second.to_state(), held, decided, "generation 1 of run 42"
        )

    asyncio.run(scenario())


def test_apply_refuses_a_missing_decision(client, console):
    async def scenario():
        found = await hand_over(
            client,
            console,
            [("call_1", STAGING), ("call_2", PRODUCTION)],
            decide={"call_1": ("approve", "")},
        )
        await assert_refused(client, *found, r"no decision for the interruptions \['call_2'\]")

    asyncio.run(scenario())


def test_apply_refuses_an_unknown_key_after_asking_once_more(client, console):
    stranger = Ed25519PrivateKey.generate()

    def tamper(run):
        run["decisions"][0] = sign(run["decisions"][0]["payload"], stranger, "x9")

    async def scenario():
        found = await hand_over(client, console, [("call_1", STAGING)], tamper=tamper)
        await assert_refused(client, *found, "signed with key 'x9', which the console does not")
        # The first look and one more for the unknown id; then refused.
        assert console.paths().count("/api/v1/keys") == 2

    asyncio.run(scenario())


def test_apply_accepts_a_key_published_since_the_keys_were_cached(client, console):
    async def scenario():
        assert set(await client.public_keys()) == {"d1"}
        console.keys = {"d2": Ed25519PrivateKey.generate(), **console.keys}
        caller, state, held, decided = await hand_over(client, console, [("call_1", STAGING)])
        assert decided.decisions[0].key_id == "d2"
        await client.apply_decisions(state, held, decided.decisions)
        await Runner.run(caller.agent, state)
        assert caller.executions == [STAGING]
        assert console.paths().count("/api/v1/keys") == 2

    asyncio.run(scenario())


def test_apply_refuses_a_run_that_does_not_name_its_tenant(client, console):
    async def scenario():
        caller, state, held, decided = await hand_over(client, console, [("call_1", STAGING)])
        nameless = type(held)(**{**held.__dict__, "tenant": None})
        await assert_refused(client, caller, state, nameless, decided, "does not name its tenant")

    asyncio.run(scenario())


def test_apply_refuses_before_the_decisions_are_in(client, console):
    async def scenario():
        caller = caller_agent([("call_1", STAGING)])
        result = await Runner.run(caller.agent, "Deploy")
        held = await client.submit_pause(result, agent="release", version="1")
        await assert_refused(
            client, caller, result.to_state(), held, held, "is paused and carries no decisions"
        )

    asyncio.run(scenario())


def test_apply_needs_the_state_itself(client, console):
    async def scenario():
        caller, state, held, decided = await hand_over(client, console, [("call_1", STAGING)])
        with pytest.raises(TypeError, match="needs the RunState you will resume"):
            await client.apply_decisions(state.to_json(), decided)

    asyncio.run(scenario())
