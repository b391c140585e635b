"""bench_pair: two checkouts measured alternately; the order turns, the warm-up is left out."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from devtools.bench import pair


def test_alternate_turns_the_order_each_round_and_numbers_every_call():
    calls: list[tuple[str, int]] = []

    def side(name: str):
        return lambda number: calls.append((name, number))

    seconds = pair.alternate([side("a"), side("b")], 3, warm=1)

    assert calls == [("a", 0), ("b", 1), ("b", 2), ("a", 3), ("a", 4), ("b", 5)]
    # The first round of each side is the warm-up: two timed calls each.
    assert [len(s) for s in seconds] == [2, 2]
    assert all(s >= 0 for side_seconds in seconds for s in side_seconds)


def test_alternate_keeps_the_seconds_a_side_measured_itself():
    measured = iter([0.5, 0.25, 0.125, 2.0])

    def side(number: int) -> float:
        # A batch's own figure (its first claim to its last end), not the call's wall time.
        return next(measured)

    seconds = pair.alternate([side, side], 2, warm=0)

    # Round 0: a then b; round 1: b then a.
    assert seconds == [[0.5, 2.0], [0.25, 0.125]]


def test_the_table_gives_each_side_and_the_second_against_the_first():
    text = pair.table(
        {"decision": [[0.010, 0.010, 0.010], [0.005, 0.005, 0.005]]}, ["here (abc)", "there (def)"]
    )

    lines = text.splitlines()
    assert lines[2] == "| decision | here (abc) | 3 | 10.0 / 10.0 / 10.0 | 1.000 |"
    assert lines[3] == "| decision | there (def) | 3 | 5.0 / 5.0 / 5.0 | 0.500 |"


def test_the_commit_of_a_directory_outside_git_is_unknown(tmp_path):
    assert pair.commit_of(tmp_path) == "?"


def test_bench_pair_refuses_a_directory_that_is_no_checkout(tmp_path):
    with pytest.raises(CommandError, match="is not a checkout of the console"):
        call_command("bench_pair", str(tmp_path))


def test_bench_pair_refuses_a_warm_up_as_long_as_the_measure(tmp_path):
    (tmp_path / "manage.py").write_text("")

    with pytest.raises(CommandError, match="--submits must be 0 or more than --warm"):
        call_command("bench_pair", str(tmp_path), "--submits", "20", "--warm", "20")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the bench needs PostgreSQL")
def test_bench_pair_refuses_a_database_not_named_for_the_bench(tmp_path):
    (tmp_path / "manage.py").write_text("")

    with pytest.raises(SystemExit, match="the bench database's name must contain 'bench'"):
        call_command("bench_pair", str(tmp_path))
