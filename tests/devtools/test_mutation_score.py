from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from devtools import mutation_score

LEDGER = "approvals.execution.ledger.x_idempotency_key__mutmut_"


def _write_results(root: Path, module: str, exit_codes: dict[str, int | None]) -> None:
    meta = root / f"{module}.meta"
    meta.parent.mkdir(parents=True, exist_ok=True)
    meta.write_text(json.dumps({"exit_code_by_key": exit_codes}), "utf-8")


def _pyproject(tmp_path: Path, *patterns: str) -> Path:
    path = tmp_path / "pyproject.toml"
    listed = ", ".join(f'"{p}"' for p in patterns)
    path.write_text(f"[tool.mutmut]\nonly_mutate = [{listed}]\n", "utf-8")
    return path


def test_score_module_counts_each_outcome_and_sets_equivalents_aside():
    exit_codes = {
        f"{LEDGER}1": 1,
        f"{LEDGER}2": 3,
        f"{LEDGER}3": 36,
        f"{LEDGER}4": 0,
        f"{LEDGER}5": 0,
        f"{LEDGER}6": 33,
        f"{LEDGER}7": None,
    }

    scored = mutation_score.score_module(
        module="approvals/execution/ledger.py",
        exit_codes=exit_codes,
        equivalents={f"{LEDGER}5": "the default is never reached"},
    )

    assert scored.counts == {
        "killed": 2,
        "timeout": 1,
        "survived": 1,
        "no_tests": 1,
        "skipped": 0,
        "suspicious": 0,
        "equivalent": 1,
    }
    assert scored.not_checked == 1
    assert scored.scored == 5
    assert scored.score == pytest.approx(60.0)
    assert scored.survivors == [f"{LEDGER}4: survived", f"{LEDGER}6: no tests"]


def test_score_module_killed_mutant_listed_as_equivalent_stays_killed():
    scored = mutation_score.score_module(
        module="m.py", exit_codes={"m.x_f__mutmut_1": 1}, equivalents={"m.x_f__mutmut_1": "why"}
    )

    assert (scored.counts["killed"], scored.counts["equivalent"]) == (1, 0)


def test_main_exits_1_when_the_guarantee_modules_score_below_90(tmp_path):
    mutants = tmp_path / "mutants"
    killed = {f"{LEDGER}{n}": 1 for n in range(8)}
    _write_results(mutants, "approvals/execution/ledger.py", {**killed, f"{LEDGER}9": 0})
    _write_results(mutants, "approvals/other.py", {"approvals.other.x_f__mutmut_1": 1})
    equivalents = tmp_path / "equivalents.toml"
    equivalents.write_text("[equivalent]\n", "utf-8")

    code = mutation_score.main(
        [
            str(mutants),
            "--equivalents",
            str(equivalents),
            "--pyproject",
            str(_pyproject(tmp_path, "approvals/execution/*")),
        ]
    )

    assert code == 1


def test_main_exits_0_once_the_survivor_is_listed_equivalent(tmp_path, capsys):
    mutants = tmp_path / "mutants"
    killed = {f"{LEDGER}{n}": 1 for n in range(8)}
    _write_results(mutants, "approvals/execution/ledger.py", {**killed, f"{LEDGER}9": 0})
    equivalents = tmp_path / "equivalents.toml"
    equivalents.write_text(
        f'[equivalent]\n"{LEDGER}9" = "same value either way"\n[change]\n"{LEDGER}9" = "0123456789ab"\n',
        "utf-8",
    )

    code = mutation_score.main(
        [
            str(mutants),
            "--equivalents",
            str(equivalents),
            "--pyproject",
            str(_pyproject(tmp_path, "approvals/execution/ledger.py")),
        ]
    )

    out = capsys.readouterr().out
    assert code == 0
    assert out.splitlines()[1].split()[:3] == ["approvals/execution/ledger.py", "100.0%", "8"]
    assert out.splitlines()[2].split()[:4] == ["total", "(guarantee", "modules)", "100.0%"]


def test_report_total_leaves_out_modules_outside_the_guarantee_list():
    results = {
        "approvals/execution/ledger.py": {f"{LEDGER}1": 1},
        "approvals/other.py": {"approvals.other.x_f__mutmut_1": 0},
    }

    total = mutation_score.report(
        results=results,
        equivalents={},
        patterns=["approvals/execution/ledger.py"],
        out=io.StringIO(),
    )

    assert (total.caught, total.scored) == (1, 1)


CHAIN = "approvals.audit.chain.x__append_linked__mutmut_"


def test_merge_results_takes_each_mutants_best_outcome_over_the_legs():
    sqlite = {"approvals/audit/chain.py": {f"{CHAIN}1": 33, f"{CHAIN}2": 0, f"{CHAIN}3": 1}}
    postgres = {"approvals/audit/chain.py": {f"{CHAIN}1": 1, f"{CHAIN}2": 0, f"{CHAIN}3": 0}}

    merged = mutation_score.merge_results([sqlite, postgres])

    # No test on SQLite, killed on PostgreSQL; survived on both; killed on SQLite only.
    assert merged == {"approvals/audit/chain.py": {f"{CHAIN}1": 1, f"{CHAIN}2": 0, f"{CHAIN}3": 1}}


def test_merge_results_keeps_the_modules_of_one_leg_alone():
    sqlite = {"approvals/members.py": {"approvals.members.x_f__mutmut_1": 0}}
    postgres = {"approvals/audit/chain.py": {f"{CHAIN}1": None}}

    merged = mutation_score.merge_results([sqlite, postgres])

    assert merged == {**sqlite, **postgres}


def test_main_scores_the_postgresql_legs_kills_of_mutants_without_a_test_on_sqlite(
    tmp_path, capsys
):
    _write_results(tmp_path / "mutants", "approvals/audit/chain.py", {f"{CHAIN}1": 33})
    postgres = tmp_path / "var" / "mutants"
    _write_results(postgres, "approvals/audit/chain.py", {f"{CHAIN}1": 1})
    equivalents = tmp_path / "equivalents.toml"
    equivalents.write_text("[equivalent]\n", "utf-8")
    pyproject = str(_pyproject(tmp_path, "approvals/audit/chain.py"))

    alone = mutation_score.main(
        [str(tmp_path / "mutants"), "--equivalents", str(equivalents), "--pyproject", pyproject]
    )
    both = mutation_score.main(
        [
            str(tmp_path / "mutants"),
            str(postgres),
            "--equivalents",
            str(equivalents),
            "--pyproject",
            pyproject,
        ]
    )

    assert (alone, both) == (1, 0)
    assert capsys.readouterr().out.splitlines()[-1].split()[:4] == [
        "total",
        "(guarantee",
        "modules)",
        "100.0%",
    ]


def test_load_equivalents_refuses_an_entry_without_a_reason(tmp_path):
    path = tmp_path / "equivalents.toml"
    path.write_text(f'[equivalent]\n"{LEDGER}1" = " "\n', "utf-8")

    with pytest.raises(ValueError, match="needs a one-line reason"):
        mutation_score.load_equivalents(path)


def test_main_exits_2_without_results(tmp_path, capsys):
    code = mutation_score.main([str(tmp_path / "mutants")])

    assert code == 2
    assert capsys.readouterr().err == (
        f"No mutation results under {tmp_path / 'mutants'}: run mutmut first.\n"
    )


def test_checked_in_equivalents_each_carry_a_reason():
    equivalents = mutation_score.load_equivalents(mutation_score.EQUIVALENTS)

    assert all("__mutmut_" in name for name in equivalents)


DIFF = """--- approvals/core/crypto.py
+++ approvals/core/crypto.py
@@ -1,4 +1,4 @@
 def seal(data):
-    packed = zlib.compress(data, 6)
+    packed = zlib.compress(data, 7)
     return packed"""


def test_fingerprint_reads_the_changed_lines_only():
    moved = DIFF.replace("def seal(data):", "def seal(data, *, key):").replace("    ", "        ")
    other = DIFF.replace("data, 7)", "data, 5)")

    assert mutation_score.changed_lines(DIFF) == [
        "- packed = zlib.compress(data, 6)",
        "+ packed = zlib.compress(data, 7)",
    ]
    assert mutation_score.fingerprint(moved) == mutation_score.fingerprint(DIFF)
    assert mutation_score.fingerprint(other) != mutation_score.fingerprint(DIFF)
    assert len(mutation_score.fingerprint(DIFF)) == 12


def test_load_changes_refuses_an_equivalent_without_its_change(tmp_path):
    path = tmp_path / "equivalents.toml"
    path.write_text(f'[equivalent]\n"{LEDGER}1" = "never read"\n[change]\n', "utf-8")

    with pytest.raises(ValueError, match=f"equivalent mutant {LEDGER}1 needs its change"):
        mutation_score.load_changes(path)


def test_load_changes_refuses_a_change_of_no_listed_equivalent(tmp_path):
    path = tmp_path / "equivalents.toml"
    path.write_text(f'[equivalent]\n[change]\n"{LEDGER}1" = "0123456789ab"\n', "utf-8")

    with pytest.raises(ValueError, match=f"lists {LEDGER}1, which is not a known equivalent"):
        mutation_score.load_changes(path)


def test_checked_in_equivalents_each_carry_their_change():
    changes = mutation_score.load_changes(mutation_score.EQUIVALENTS)

    assert set(changes) == set(mutation_score.load_equivalents(mutation_score.EQUIVALENTS))
    assert all(len(change) == 12 for change in changes.values())


def test_report_scores_a_stale_equivalent_by_its_outcome_and_names_its_change():
    out = io.StringIO()
    results = {"approvals/execution/ledger.py": {f"{LEDGER}1": 0, f"{LEDGER}2": 1}}

    total = mutation_score.report(
        results=results,
        equivalents={f"{LEDGER}1": "was a default never read"},
        patterns=["approvals/execution/ledger.py"],
        stale={f"{LEDGER}1": ["- key = part", "+ key = None"]},
        out=out,
    )

    assert (total.counts["survived"], total.counts["equivalent"]) == (1, 0)
    assert total.score == pytest.approx(50.0)
    assert out.getvalue().endswith(
        "Listed as equivalent, but the mutant now makes another change (check it again):\n"
        f"  {LEDGER}1: - key = part | + key = None\n"
    )


def _generated(tmp_path: Path) -> Path:
    """A run's copy of one module as mutmut writes it: the original and two mutants."""
    module = tmp_path / "mutants" / "approvals" / "limits.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "def x_cap__mutmut_orig(n):\n    return min(n, 10)\n\n\n"
        "def x_cap__mutmut_1(n):\n    return max(n, 10)\n\n\n"
        "def x_cap__mutmut_2(n):\n    return min(n, 11)\n",
        "utf-8",
    )
    return tmp_path / "mutants"


def test_stale_equivalents_reads_each_listed_mutants_change_from_the_runs_copy(tmp_path):
    pytest.importorskip("mutmut")
    mutants = _generated(tmp_path)
    name = "approvals.limits.x_cap__mutmut_"
    results = {"approvals/limits.py": {f"{name}1": 34, f"{name}2": 34}}
    listed = mutation_score.fingerprint("-    return min(n, 10)\n+    return min(n, 11)")

    stale = mutation_score.stale_equivalents(
        [mutants], results, {f"{name}1": listed, f"{name}2": listed}
    )

    # Mutant 2 still makes the listed change; mutant 1 (the number moved) makes another.
    assert stale == {f"{name}1": ["- return min(n, 10)", "+ return max(n, 10)"]}


def test_changes_prints_the_table_of_the_listed_equivalents_as_they_are_now(tmp_path, capsys):
    pytest.importorskip("mutmut")
    mutants = _generated(tmp_path)
    name = "approvals.limits.x_cap__mutmut_2"
    _write_results(mutants, "approvals/limits.py", {name: 0})
    equivalents = tmp_path / "equivalents.toml"
    equivalents.write_text(f'[equivalent]\n"{name}" = "eleven is ten here"\n', "utf-8")

    code = mutation_score.main([str(mutants), "--equivalents", str(equivalents), "--changes"])

    change = mutation_score.fingerprint("-    return min(n, 10)\n+    return min(n, 11)")
    assert code == 0
    assert capsys.readouterr().out == (
        f'[change]\n"{name}" = "{change}"  # - return min(n, 10) | + return min(n, 11)\n'
    )
