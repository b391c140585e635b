"""Canonical JSON of tool arguments, and recognising secrets by key name or value shape."""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from approvals.core.canonical import (
    arguments_digest,
    canonical_arguments,
    canonical_json,
    parse_arguments,
    sha256_hex,
)
from approvals.core.redaction import find_secrets, is_secret_key, mask_secrets, redact, secret_shape

# Built from parts so that no complete fake credential sits in the source.
OPENAI_KEY = "sk-" + "proj" + "A1b2C3d4E5f6G7h8I9j0"
SECRETS = {
    "OpenAI-style key": OPENAI_KEY,
    "GitHub token": "ghp" + "_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "Slack token": "xoxb" + "-" + "1234567890-abcdefghij",
    "AWS access key id": "AKIA" + "IOSFODNN7EXAMPLE",
    "Google API key": "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
    "Stripe key": "sk_" + "live_" + "a1B2c3D4e5F6g7H8i9J0",
    "private key": "-----BEGIN RSA " + "PRIVATE KEY-----\nMIIEow...",
    "JSON web token": "eyJ" + "hbGciOiJIUzI1NiJ9.eyJ" + "zdWIiOiIxMjM0NTY3ODkwIn0.abcdefghijk",
    "bearer credential": "Bearer " + "abcdefghijklmnop1234",
    "password in a URL": "postgres://app:" + "hunter2" + "@db.example.com/app",
}

json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=15,
)


# --- canonical JSON -------------------------------------------------------------------------


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_canonical_json_dict_key_order_is_irrelevant(value):
    reordered = dict(reversed(list(value.items())))

    assert canonical_json(reordered) == canonical_json(value)


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_arguments_digest_whitespace_and_key_order_are_irrelevant(value):
    compact = json.dumps(value, separators=(",", ":"))
    spaced = json.dumps(dict(reversed(list(value.items()))), indent=2)

    assert arguments_digest(spaced) == arguments_digest(compact)


@given(json_values)
def test_canonical_arguments_round_trips_through_parse(value):
    canonical = canonical_arguments(json.dumps(value))

    assert json.loads(canonical) == value
    assert canonical_arguments(canonical) == canonical


def test_arguments_digest_reordered_keys_are_equal():
    assert arguments_digest('{"a":1,"b":2}') == arguments_digest('{"b":2, "a":1}')


def test_arguments_digest_is_sha256_of_the_canonical_form():
    assert arguments_digest('{"b": 2, "a": 1}') == sha256_hex('{"a":1,"b":2}')


@pytest.mark.parametrize(
    "other",
    ['{"a":1,"b":3}', '{"a":1}', '{"a":1,"b":"2"}', '{"a":1,"B":2}', '{"a":1,"b":[2]}'],
)
def test_arguments_digest_different_values_differ(other):
    assert arguments_digest(other) != arguments_digest('{"a":1,"b":2}')


def test_canonical_json_keeps_non_ascii_text():
    assert canonical_json({"city": "Zürich", "名": "值"}) == '{"city":"Zürich","名":"值"}'


@pytest.mark.parametrize("raw", [None, ""])
def test_parse_arguments_empty_is_an_empty_object(raw):
    assert parse_arguments(raw) == {}


@pytest.mark.parametrize(
    "raw",
    ['{"a":1,"a":2}', '{"outer":{"env":"staging","env":"production"}}', '[{"x":1,"x":1}]'],
    ids=["top-level", "nested", "in-a-list"],
)
def test_parse_arguments_duplicate_keys_are_kept_unparsed(raw):
    assert parse_arguments(raw) == {"__unparsed__": raw}


@pytest.mark.parametrize("raw", ["not json", '{"a":1', "{'a': 1}", '{"a": NaN'])
def test_parse_arguments_invalid_json_is_kept_unparsed(raw):
    assert parse_arguments(raw) == {"__unparsed__": raw}


def test_arguments_digest_duplicate_keys_differ_from_either_reading():
    raw = '{"env":"staging","env":"production"}'

    assert canonical_arguments(raw) == json.dumps({"__unparsed__": raw}, separators=(",", ":"))
    assert arguments_digest(raw) != arguments_digest('{"env":"production"}')
    assert arguments_digest(raw) != arguments_digest('{"env":"staging"}')


# --- secret key names ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "api_key",
        "apiKey",
        "APIKey",
        "OPENAI_API_KEY",
        "x-api-key",
        "password",
        "Authorization",
        "client_secret",
        "accessToken",
        "auth_token",
        "privateKey",
        "session_key",
    ],
)
def test_is_secret_key_secret_names_are_flagged(name):
    assert is_secret_key(name) is True


@pytest.mark.parametrize(
    "name", ["max_tokens", "tenant", "release", "environment", "keyboard", "monkey", "author"]
)
def test_is_secret_key_ordinary_names_are_not_flagged(name):
    assert is_secret_key(name) is False


@pytest.mark.parametrize(
    "name", ["token_count", "max_tokens", "input_tokens", "password_policy", "tokenUsage"]
)
def test_is_secret_key_names_that_describe_a_secret_are_not_flagged(name):
    # A usage counter is not a credential; refusing it would block ordinary contexts.
    assert is_secret_key(name) is False


@pytest.mark.parametrize(
    "name", ["passwords", "api_keys", "apiKeys", "access_tokens", "secrets", "client_secrets"]
)
def test_is_secret_key_plural_names_are_flagged(name):
    # A context {"passwords": ["hunter2"]} must be refused as surely as {"password": "hunter2"}.
    assert is_secret_key(name) is True


# --- secret value shapes -------------------------------------------------------------------


@pytest.mark.parametrize(("label", "value"), list(SECRETS.items()), ids=list(SECRETS))
def test_secret_shape_listed_shapes_are_detected(label, value):
    assert secret_shape(value) == label


@pytest.mark.parametrize(("label", "value"), list(SECRETS.items()), ids=list(SECRETS))
def test_secret_shape_detected_inside_longer_text(label, value):
    assert secret_shape(f"please use {value} for the deploy") == label


@pytest.mark.parametrize(
    "text",
    [
        "Deploy release 2026.07.24",
        "Deploy release 2026.07.24 to production",
        "Publish test invoice INV-781",
        "ask-questions-about-the-release-notes-2026",
        "postgres://db.example.com:5432/approvals",
        "https://example.com/releases/2026.07.24",
        "sk-short",
        "Bearer of good news",
        "",
    ],
)
def test_secret_shape_ordinary_text_is_none(text):
    assert secret_shape(text) is None


# --- find_secrets and redact ------------------------------------------------------------------


def test_find_secrets_returns_paths_not_values():
    context = {
        "tenant": "acme",
        "user": {"api_key": "plain-looking-value", "name": "Ann"},
        "notes": ["ship it", OPENAI_KEY],
    }

    found = list(find_secrets(context))

    assert found == [
        "context.user.api_key (key name)",
        "context.notes[1] (looks like a OpenAI-style key)",
    ]
    assert [f for f in found if "plain-looking-value" in f or OPENAI_KEY in f] == []


def test_find_secrets_empty_secret_named_values_are_not_reported():
    context = {"password": "", "token": None, "api_key": [], "secret": {}}

    assert list(find_secrets(context)) == []


def test_find_secrets_ordinary_context_finds_nothing():
    context = {"tenant": "acme", "release": "2026.07.24", "max_tokens": 512, "tags": ["a", "b"]}

    assert list(find_secrets(context)) == []


def test_redact_replaces_secret_keys_and_values_and_keeps_the_rest():
    value = {
        "password": "hunter2",
        "nested": [{"note": f"token is {OPENAI_KEY}"}, 3, None],
        "release": "2026.07.24",
    }

    assert redact(value) == {
        "password": "[redacted]",
        "nested": [{"note": "[redacted]"}, 3, None],
        "release": "2026.07.24",
    }


secretish_text = st.sampled_from(list(SECRETS.values())) | st.builds(
    lambda before, secret, after: f"{before}{secret} {after}",
    st.text(max_size=10).map(lambda s: s + " "),
    st.sampled_from(list(SECRETS.values())),
    st.text(max_size=10),
)
mixed_scalars = json_scalars | secretish_text
mixed_values = st.recursive(
    mixed_scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(st.sampled_from(["a", "note", "items", "env", "x"]), children, max_size=4)
    ),
    max_leaves=20,
)


def _strings(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, str):
        yield value


@given(mixed_values)
def test_redact_output_never_holds_a_secret_shaped_value(value):
    redacted = redact(value)

    assert [s for s in _strings(redacted) if secret_shape(s)] == []
    assert list(find_secrets(redacted)) == []


@given(st.recursive(json_scalars, lambda c: st.lists(c, max_size=3), max_leaves=10))
def test_redact_without_secrets_is_the_identity(value):
    # Plain text from hypothesis is vanishingly unlikely to be shaped like a credential.
    assume(not any(secret_shape(s) for s in _strings(value)))

    assert redact(value) == value


def test_mask_secrets_replaces_only_the_secret_part_of_free_text():
    token = "ghp_" + "A1b2C3d4E5" * 4
    text = f"deploy with {token} and postgres://app:hunter2@db/prod please"

    assert mask_secrets(text) == "deploy with [redacted] and [redacted]db/prod please"
    assert mask_secrets("nothing secret here") == "nothing secret here"
