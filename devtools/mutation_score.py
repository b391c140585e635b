"""The mutation score of the guarantee modules, from a mutmut run's result files.

`python -m devtools.mutation_score mutants var/mutation-postgres/mutants` reads the `.py.meta`
files mutmut writes under its copy of the project, one copy per leg of the run (a mutant counts
as its best outcome over the legs), prints per module how many mutants were killed, survived,
timed out, had no test, or are known equivalents (devtools/mutation_equivalents.toml), and the
total. The score is killed / (all - equivalent - not checked); a timeout counts as killed (the mutant hung
the tests, which a person notices), and a mutant no test reaches counts against the score.

A known equivalent is listed with the change it makes (a fingerprint of its diff's changed lines):
mutmut numbers a function's mutants in order, so an edit to the function can give a listed number
to another change. Where the run's copy of the code can be read, a listed equivalent whose change
differs is not set aside but reported, to be checked again (`--changes` prints the fingerprints
of the listed equivalents as they are now).

Exits 1 when the guarantee modules ([tool.mutmut] only_mutate in pyproject.toml) score below
90 % together, 2 when there is no result to read.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import json
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

THRESHOLD = 90.0
ROOT = Path(__file__).resolve().parent.parent
EQUIVALENTS = Path(__file__).resolve().parent / "mutation_equivalents.toml"

# mutmut's exit codes (mutmut/stats.py), folded into the columns the score reports.
_STATUS_BY_EXIT_CODE: dict[int | None, str] = {
    1: "killed",
    3: "killed",
    37: "killed",
    0: "survived",
    5: "no_tests",
    33: "no_tests",
    34: "skipped",
    36: "timeout",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
    None: "not_checked",
}
COLUMNS = ("killed", "timeout", "survived", "no_tests", "skipped", "suspicious", "equivalent")


@dataclass
class ModuleScore:
    """The mutants of one module, by outcome, and the names of those that count against it."""

    module: str
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COLUMNS, 0))
    not_checked: int = 0
    survivors: list[str] = field(default_factory=list)

    @property
    def scored(self) -> int:
        """The mutants the score is over: all checked ones but the known equivalents."""
        return sum(self.counts.values()) - self.counts["equivalent"]

    @property
    def caught(self) -> int:
        return self.counts["killed"] + self.counts["timeout"]

    @property
    def score(self) -> float:
        return 100.0 * self.caught / self.scored if self.scored else 100.0

    def add(self, other: ModuleScore) -> None:
        for column in COLUMNS:
            self.counts[column] += other.counts[column]
        self.not_checked += other.not_checked
        self.survivors += other.survivors


def status_of(exit_code: int | None) -> str:
    """The column of one mutmut exit code; an unknown code is suspicious (counted, not killed)."""
    return _STATUS_BY_EXIT_CODE.get(exit_code, "suspicious")


def load_equivalents(path: Path) -> dict[str, str]:
    """The known equivalent mutants, name -> why, from the checked-in TOML file.

    Raises:
        ValueError: an entry has no one-line reason.
    """
    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text("utf-8"))
    equivalents = data.get("equivalent", {})
    for name, why in equivalents.items():
        if not isinstance(why, str) or not why.strip():
            raise ValueError(f"{path}: equivalent mutant {name} needs a one-line reason.")
    return dict(equivalents)


def load_changes(path: Path) -> dict[str, str]:
    """Each known equivalent's change, name -> fingerprint, from the [change] table.

    Raises:
        ValueError: an equivalent has no change listed, or a change names no listed equivalent.
    """
    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text("utf-8"))
    equivalents, changes = data.get("equivalent", {}), data.get("change", {})
    for name in equivalents:
        if not isinstance(changes.get(name), str):
            raise ValueError(
                f"{path}: equivalent mutant {name} needs its change in [change]: "
                f"python -m devtools.mutation_score mutants --changes prints it."
            )
    for name in changes:
        if name not in equivalents:
            raise ValueError(f"{path}: [change] lists {name}, which is not a known equivalent.")
    return dict(changes)


def changed_lines(diff: str) -> list[str]:
    """The lines a mutant's unified diff removes and adds, without their indentation."""
    return [
        f"{line[0]} {line[1:].strip()}"
        for line in diff.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]


def fingerprint(diff: str) -> str:
    """A mutant's change in 12 characters: its diff's changed lines, whatever the context."""
    return hashlib.sha256("\n".join(changed_lines(diff)).encode("utf-8")).hexdigest()[:12]


def mutant_diff(mutants_dir: Path, module: str, name: str) -> str | None:
    """The diff mutmut shows for one mutant of module, from the run's copy of the code; None
    where that copy cannot be read (no generated code, or no such mutant in it)."""
    if not (mutants_dir / module).is_file():
        return None
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    try:
        with contextlib.chdir(mutants_dir.parent):
            return get_diff_for_mutant(name, path=module)
    except (OSError, ValueError):
        return None


def current_diffs(
    mutants_dirs: Iterable[Path],
    results: Mapping[str, Mapping[str, int | None]],
    names: Iterable[str],
) -> dict[str, str]:
    """Each named mutant's diff as the run's copy of the code has it now, from the first leg
    whose copy holds it; a name no copy holds is left out."""
    module_of = {name: module for module, codes in results.items() for name in codes}
    found: dict[str, str] = {}
    for name in names:
        module = module_of.get(name)
        diffs = (mutant_diff(path, module, name) for path in mutants_dirs) if module else ()
        diff = next((d for d in diffs if d is not None), None)
        if diff is not None:
            found[name] = diff
    return found


def stale_equivalents(
    mutants_dirs: Iterable[Path],
    results: Mapping[str, Mapping[str, int | None]],
    changes: Mapping[str, str],
) -> dict[str, list[str]]:
    """The listed equivalents whose mutant now makes another change: name -> its changed lines.

    One no leg's copy of the code holds is not judged here.
    """
    diffs = current_diffs(mutants_dirs, results, sorted(changes))
    return {
        name: changed_lines(diff)
        for name, diff in diffs.items()
        if fingerprint(diff) != changes[name]
    }


def guarantee_patterns(pyproject: Path) -> list[str]:
    """The guarantee modules' paths (globs) from [tool.mutmut] only_mutate."""
    data = tomllib.loads(pyproject.read_text("utf-8"))
    return list(data.get("tool", {}).get("mutmut", {}).get("only_mutate", []))


def module_name(meta_path: Path, mutants_dir: Path) -> str:
    """`mutants/approvals/audit/chain.py.meta` -> `approvals/audit/chain.py`."""
    return meta_path.relative_to(mutants_dir).as_posix().removesuffix(".meta")


def score_module(
    *, module: str, exit_codes: Mapping[str, int | None], equivalents: Mapping[str, str]
) -> ModuleScore:
    """One module's score from its mutants' exit codes, the known equivalents set aside."""
    result = ModuleScore(module=module)
    for name, exit_code in sorted(exit_codes.items()):
        status = status_of(exit_code)
        if status == "not_checked":
            result.not_checked += 1
            continue
        if name in equivalents and status not in ("killed", "timeout"):
            status = "equivalent"
        result.counts[status] += 1
        if status in ("survived", "no_tests", "skipped", "suspicious"):
            result.survivors.append(f"{name}: {status.replace('_', ' ')}")
    return result


def read_results(mutants_dir: Path) -> dict[str, dict[str, int | None]]:
    """Each mutated module's mutant exit codes, from mutmut's .meta files."""
    results: dict[str, dict[str, int | None]] = {}
    for meta_path in sorted(mutants_dir.rglob("*.py.meta")):
        meta = json.loads(meta_path.read_text("utf-8"))
        results[module_name(meta_path, mutants_dir)] = meta.get("exit_code_by_key", {})
    return results


# The order of outcomes, best first: a mutant checked on both legs of the run (SQLite and
# PostgreSQL) counts as its best one, as the suite runs on both and a failure on either kills it.
_RANK = {
    status: rank
    for rank, status in enumerate(
        ("killed", "timeout", "survived", "suspicious", "skipped", "no_tests", "not_checked")
    )
}


def merge_results(
    legs: Iterable[Mapping[str, Mapping[str, int | None]]],
) -> dict[str, dict[str, int | None]]:
    """The results of several legs as one: each mutant's best outcome over the legs."""
    merged: dict[str, dict[str, int | None]] = {}
    for leg in legs:
        for module, exit_codes in leg.items():
            into = merged.setdefault(module, {})
            for name, exit_code in exit_codes.items():
                if name not in into or _RANK[status_of(exit_code)] < _RANK[status_of(into[name])]:
                    into[name] = exit_code
    return merged


def is_guarantee(module: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatch(module, pattern) for pattern in patterns)


def report(
    *,
    results: Mapping[str, Mapping[str, int | None]],
    equivalents: Mapping[str, str],
    patterns: list[str],
    stale: Mapping[str, list[str]] | None = None,
    out=None,
) -> ModuleScore:
    """Print the table and the survivors; return the guarantee modules' total.

    A listed equivalent in stale is scored by its outcome, and reported with its change as now.
    """
    out = out or sys.stdout
    stale = stale or {}
    equivalents = {name: why for name, why in equivalents.items() if name not in stale}
    total = ModuleScore(module="guarantee modules")
    header = f"{'module':<36} {'score':>7} " + " ".join(f"{c:>10}" for c in COLUMNS)
    print(header, file=out)
    for module, exit_codes in sorted(results.items()):
        scored = score_module(module=module, exit_codes=exit_codes, equivalents=equivalents)
        if is_guarantee(module, patterns):
            total.add(scored)
        line = f"{module:<36} {scored.score:>6.1f}% " + " ".join(
            f"{scored.counts[c]:>10}" for c in COLUMNS
        )
        if scored.not_checked:
            line += f"  ({scored.not_checked} not checked)"
        print(line, file=out)
    print(
        f"{'total (guarantee modules)':<36} {total.score:>6.1f}% "
        + " ".join(f"{total.counts[c]:>10}" for c in COLUMNS),
        file=out,
    )
    if total.survivors:
        print("\nNot killed:", file=out)
        for survivor in total.survivors:
            print(f"  {survivor}", file=out)
    unknown = sorted(
        name for name in equivalents if not any(name in codes for codes in results.values())
    )
    if unknown:
        print("\nEquivalents listed but not among the mutants (stale?):", file=out)
        for name in unknown:
            print(f"  {name}", file=out)
    if stale:
        print(
            "\nListed as equivalent, but the mutant now makes another change (check it again):",
            file=out,
        )
        for name, lines in stale.items():
            print(f"  {name}: " + " | ".join(lines), file=out)
    return total


def print_changes(
    mutants_dirs: Iterable[Path],
    results: Mapping[str, Mapping[str, int | None]],
    equivalents: Mapping[str, str],
) -> int:
    """Print the [change] table for the listed equivalents; 2 when one cannot be read."""
    diffs = current_diffs(mutants_dirs, results, equivalents)
    print("[change]")
    for name, diff in diffs.items():
        print(f'"{name}" = "{fingerprint(diff)}"  # ' + " | ".join(changed_lines(diff)))
    missing = [name for name in equivalents if name not in diffs]
    for name in missing:
        print(f"No mutant {name} in the run's copy of the code.", file=sys.stderr)
    return 2 if missing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.mutation_score")
    parser.add_argument(
        "mutants_dirs",
        type=Path,
        nargs="+",
        metavar="mutants_dir",
        help="mutmut's copy of the project (mutants/), one per leg of the run",
    )
    parser.add_argument("--equivalents", type=Path, default=EQUIVALENTS)
    parser.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml")
    parser.add_argument("--threshold", type=float, default=THRESHOLD)
    parser.add_argument(
        "--changes",
        action="store_true",
        help="print the [change] table of the listed equivalents as their mutants are now",
    )
    args = parser.parse_args(argv)

    results = merge_results(read_results(path) for path in args.mutants_dirs if path.is_dir())
    if not results:
        where = ", ".join(str(path) for path in args.mutants_dirs)
        print(f"No mutation results under {where}: run mutmut first.", file=sys.stderr)
        return 2
    try:
        equivalents = load_equivalents(args.equivalents)
        changes = {} if args.changes else load_changes(args.equivalents)
    except (ValueError, tomllib.TOMLDecodeError) as error:
        print(error, file=sys.stderr)
        return 2
    if args.changes:
        return print_changes(args.mutants_dirs, results, equivalents)
    total = report(
        results=results,
        equivalents=equivalents,
        patterns=guarantee_patterns(args.pyproject),
        stale=stale_equivalents(args.mutants_dirs, results, changes),
    )
    if total.score < args.threshold:
        print(
            f"\nThe guarantee modules score {total.score:.1f} %, below {args.threshold:.0f} %.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
