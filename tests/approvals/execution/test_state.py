"""What a paused run's state is sealed under, and what it may never hold."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from approvals.execution import state

REFUSAL = (
    "the run's context holds what looks like a secret, which must never be stored: {}. Leave "
    "it out with a context_serializer and re-inject it in the context_deserializer from the "
    "environment."
)


def test_binding_known_answer():
    """What every sealed state is bound to: renaming a part would leave stored states unopenable."""
    run = SimpleNamespace(tenant_id=4, pk=17)

    assert state.binding(run, 3) == {"tenant": 4, "run": 17, "generation": 3}


def test_refuse_secrets_names_each_path_in_the_context_and_the_tool_input_word_for_word():
    state_json = {
        "context": {
            "context": {"team": "ops", "api_key": "sk-a"},
            "tool_input": {"release": "2026.12", "password": "hunter2"},
        }
    }

    with pytest.raises(state.SecretInContextError) as refused:
        state.refuse_secrets(state_json)

    assert str(refused.value) == REFUSAL.format(
        "context.api_key (key name), tool_input.password (key name)"
    )


def test_refuse_secrets_finds_a_secret_in_the_tool_input_alone():
    state_json = {"context": {"context": {"team": "ops"}, "tool_input": {"token": "abc"}}}

    with pytest.raises(state.SecretInContextError) as refused:
        state.refuse_secrets(state_json)

    assert str(refused.value) == REFUSAL.format("tool_input.token (key name)")


@pytest.mark.parametrize(
    "state_json",
    [
        {},
        {"context": None},
        {"context": {"context": {"team": "ops"}, "tool_input": {"release": "2026.12"}}},
        {"context": {"context": {"api_key": ""}, "tool_input": {"password": None}}},
    ],
    ids=["no-context", "context-not-a-mapping", "nothing-secret", "secret-names-left-empty"],
)
def test_refuse_secrets_passes_a_state_with_nothing_secret(state_json):
    assert state.refuse_secrets(state_json) is None


class _State:
    """A paused state as serialize_state sees it: only its to_json."""

    def __init__(self, context: object) -> None:
        self.context = context

    def to_json(self, **_options) -> dict:
        meta = {"serialized_via": "mapping", "requires_deserializer": False}
        return {"context": {"context": self.context, "context_meta": meta}}


NOT_STORABLE = (
    "the run's context cannot be stored: {}. Keep connections, locks and clients out of the "
    "context, or give the agent a context_serializer that leaves them out."
)


def test_serialize_state_stores_text_as_utf8_not_escaped():
    state_json, payload = state.serialize_state(
        _State({"note": "Déploiement validé"}), context={"note": "Déploiement validé"}
    )

    assert "Déploiement validé".encode() in payload
    assert state_json["context"]["context"] == {"note": "Déploiement validé"}


def test_serialize_state_refuses_a_number_json_cannot_hold_word_for_word():
    with pytest.raises(state.ContextNotSerializableError) as refused:
        state.serialize_state(_State({"ratio": float("nan")}), context={"ratio": float("nan")})

    assert str(refused.value) == NOT_STORABLE.format(
        "Out of range float values are not JSON compliant"
    )


def test_serialize_state_refuses_a_serializer_that_returns_no_mapping_word_for_word():
    with pytest.raises(state.ContextNotSerializableError) as refused:
        state.serialize_state(
            _State({"team": "ops"}), context={"team": "ops"}, context_serializer=lambda c: ["ops"]
        )

    assert str(refused.value) == NOT_STORABLE.format("the context_serializer must return a mapping")


def test_refuse_secrets_names_the_first_five_paths_only():
    context = {f"token_{n}": "x" for n in range(1, 7)}

    with pytest.raises(state.SecretInContextError) as refused:
        state.refuse_secrets({"context": {"context": context}})

    named = ", ".join(f"context.token_{n} (key name)" for n in range(1, 6))
    assert str(refused.value) == REFUSAL.format(named)
