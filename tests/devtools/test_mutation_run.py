"""The mutation run leaves out the known equivalents whose mutant still makes the listed change."""

from __future__ import annotations

from dataclasses import dataclass, field

from devtools import mutation_run, mutation_score

NAME = "approvals.core.crypto.x_seal__mutmut_"
SAME = """--- a
+++ a
@@ -1,2 +1,2 @@
-    packed = zlib.compress(data, 6)
+    packed = zlib.compress(data, 7)"""
OTHER = SAME.replace("data, 7)", "data, 5)")


@dataclass
class _FileData:
    exit_code_by_key: dict[str, int | None] = field(default_factory=dict)


def _leave_out(diffs: dict[str, str], *, named=()):
    data = _FileData(dict.fromkeys(diffs))
    mutants = [(data, name, None) for name in diffs]
    kept, left_out = mutation_run.leave_out_equivalents(
        mutants,
        changes={f"{NAME}1": mutation_score.fingerprint(SAME), f"{NAME}2": "0123456789ab"},
        named=named,
        diff_of=lambda _data, name: diffs[name],
    )
    return [name for _, name, _ in kept], left_out, data.exit_code_by_key


def test_a_listed_equivalent_making_its_listed_change_is_recorded_skipped_and_not_run():
    kept, left_out, codes = _leave_out({f"{NAME}1": SAME, f"{NAME}3": SAME})

    assert (kept, left_out) == ([f"{NAME}3"], [f"{NAME}1"])
    assert codes == {f"{NAME}1": 34, f"{NAME}3": None}
    assert mutation_score.status_of(codes[f"{NAME}1"]) == "skipped"


def test_a_listed_equivalent_whose_change_differs_is_run():
    kept, left_out, codes = _leave_out({f"{NAME}1": OTHER, f"{NAME}2": SAME})

    assert (kept, left_out) == ([f"{NAME}1", f"{NAME}2"], [])
    assert set(codes.values()) == {None}


def test_a_listed_equivalent_named_on_the_command_line_is_run():
    kept, left_out, _ = _leave_out({f"{NAME}1": SAME}, named=(f"{NAME}1",))

    assert (kept, left_out) == ([f"{NAME}1"], [])


def test_main_refuses_an_equivalents_file_without_changes_in_one_line(
    tmp_path, monkeypatch, capsys
):
    path = tmp_path / "equivalents.toml"
    path.write_text(f'[equivalent]\n"{NAME}1" = "the same bytes"\n', "utf-8")
    monkeypatch.setattr(mutation_run, "EQUIVALENTS", path)

    assert mutation_run.main([]) == 2
    assert capsys.readouterr().err.count("\n") == 1
