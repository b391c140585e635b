"""Under the mutation run a mutant's tests run in an order that reaches its killer soonest: the
tests marked as guarding the mutated function first, then those without a database."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tests.conftest import mutated_function, pytest_collection_modifyitems

RUN_AGENT = "approvals.runs.lease.x_run_agent__mutmut_10"


@dataclass
class _Item:
    name: str
    guards: tuple[str, ...] = ()
    fixturenames: list[str] = field(default_factory=list)

    def iter_markers(self, name):
        return [pytest.mark.guards(*self.guards).mark] if name == "guards" and self.guards else []

    def get_closest_marker(self, name):
        return None


def _items():
    return [
        _Item("db_test", fixturenames=["db"]),
        _Item("heartbeat", guards=("approvals.runs.lease.run_agent",), fixturenames=["db"]),
        _Item("known_answer"),
        _Item("other_guard", guards=("approvals.runs.lease.claim",), fixturenames=["db"]),
    ]


@pytest.mark.parametrize(
    ("mutant", "function"),
    [
        (RUN_AGENT, "approvals.runs.lease.run_agent"),
        ("approvals.audit.chain.xǁChainǁappend__mutmut_3", "approvals.audit.chain.Chain.append"),
        ("stats", ""),
        ("", ""),
    ],
)
def test_mutated_function_reads_the_function_a_mutant_changes(mutant, function):
    assert mutated_function(mutant) == function


def test_a_mutants_guards_go_first_then_the_tests_without_a_database(monkeypatch):
    monkeypatch.setenv("MUTANT_UNDER_TEST", RUN_AGENT)
    items = _items()

    pytest_collection_modifyitems(items)

    assert [item.name for item in items] == ["heartbeat", "known_answer", "db_test", "other_guard"]


def test_outside_the_mutation_run_the_order_is_left_alone(monkeypatch):
    monkeypatch.delenv("MUTANT_UNDER_TEST", raising=False)
    items = _items()

    pytest_collection_modifyitems(items)

    assert [item.name for item in items] == [item.name for item in _items()]
