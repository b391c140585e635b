"""The mutation score of the guarantee modules, from a mutmut run's result files.

`python -m devtools.mutation_score mutants var/mutation-postgres/mutants` reads the `.py.meta`
files mutmut writes under its copy of the project, one copy per leg of the run (a mutant counts
as its best outcome over the legs), prints per module how many mutants were killed, survived,
timed out, had no test, or are known equivalents (devtools/mutation_equivalents.toml), and the
total. The
score is killed / (all - equivalent - not checked); a timeout counts as killed (the mutant hung
the tests, which a person notices), and a mutant no test reaches counts against the score.

Exits 1 when the guarantee modules ([tool.mutmut] only_mutate in pyproject.toml) score below
90 % together, 2 when there is no result to read.
"""

from __future__ import annotations

import argparse
import fnmatch
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
    out=None,
) -> ModuleScore:
    """Print the table and the survivors; return the guarantee modules' total."""
    out = out or sys.stdout
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
    return total


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
    args = parser.parse_args(argv)

    results = merge_results(read_results(path) for path in args.mutants_dirs if path.is_dir())
    if not results:
        where = ", ".join(str(path) for path in args.mutants_dirs)
        print(f"No mutation results under {where}: run mutmut first.", file=sys.stderr)
        return 2
    try:
        equivalents = load_equivalents(args.equivalents)
    except (ValueError, tomllib.TOMLDecodeError) as error:
        print(error, file=sys.stderr)
        return 2
    total = report(
        results=results, equivalents=equivalents, patterns=guarantee_patterns(args.pyproject)
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
