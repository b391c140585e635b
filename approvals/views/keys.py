"""The keyboard hints a page shows: only the keys that do something on it for this person.

console.js acts on a key only when the page holds its control (a button with data-key, a
keyboard list); the hints are computed from the same facts that put those controls on the page
(the ticket's may_approve, may_decide and may_claim, the queue's may_batch), so they cannot
promise a key that does nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Key:
    key: str
    label: str


ESCAPE = Key("Esc", "leave a field or close a confirmation")


def queue_keys(*, has_rows: bool, may_batch: bool) -> list[Key]:
    if not has_rows:
        return []
    hints = [Key("j/k", "move"), Key("Enter", "open")]
    if may_batch:
        hints.append(Key("x", "select for a batch"))
    return hints


def decision_keys(*, may_approve: bool, may_reject: bool) -> list[Key]:
    hints = []
    if may_approve:
        hints.append(Key("a", "approve (asks to confirm)"))
    if may_reject:
        hints.append(Key("r", "reject with a message (asks to confirm)"))
    if hints:
        hints.append(ESCAPE)
    return hints


def claim_keys(*, may_claim: bool, mine: bool, free: bool) -> list[Key]:
    if may_claim and mine:
        return [Key("c", "release your claim")]
    if may_claim and free:
        return [Key("c", "claim")]
    return []
