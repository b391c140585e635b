"""`python -m devtools.mutation_run [mutant names]`: mutmut's run, the known equivalents left out.

A known equivalent (devtools/mutation_equivalents.toml) behaves as the code does, so its tests
all pass, every one of them, on every run: in the whole run of Dec 4 the 62 equivalents cost
1,333 process-seconds, a fifth of the run, to learn nothing. mutmut can leave out a line, not one
mutant, so this runs mutmut's own `run` with one step added after it generates the mutants: a
listed equivalent whose mutant still makes the change listed for it is recorded as skipped
(mutmut's exit code 34, which devtools.mutation_score counts as equivalent) and not run. One
whose change differs is run like any other mutant, and the score reports it to be checked again.
A mutant named exactly on the command line is always run, equivalent or not.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from devtools.mutation_score import EQUIVALENTS, fingerprint, load_changes

SKIPPED = 34


def leave_out_equivalents(
    mutants: Iterable[tuple[Any, str, int | None]],
    *,
    changes: Mapping[str, str],
    named: Iterable[str],
    diff_of: Callable[[Any, str], str],
) -> tuple[list[tuple[Any, str, int | None]], list[str]]:
    """The mutants to run, and the names of the equivalents left out.

    mutants are mutmut's (file data, name, result) triples; a listed equivalent left out is
    recorded as skipped in its file data (saved by the caller). diff_of(data, name) is mutmut's
    diff of one mutant.
    """
    named = set(named)
    kept: list[tuple[Any, str, int | None]] = []
    left_out: list[str] = []
    for data, name, result in mutants:
        listed = changes.get(name)
        if listed is not None and name not in named and fingerprint(diff_of(data, name)) == listed:
            data.exit_code_by_key[name] = SKIPPED
            left_out.append(name)
            continue
        kept.append((data, name, result))
    return kept, left_out


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        changes = load_changes(EQUIVALENTS)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2

    import mutmut.__main__ as mutmut_main
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    collect = mutmut_main.collect_source_file_mutation_data

    def collect_without_equivalents(*, mutant_names):
        mutants, by_path = collect(mutant_names=mutant_names)
        kept, left_out = leave_out_equivalents(
            mutants,
            changes=changes,
            named=mutant_names,
            diff_of=lambda data, name: get_diff_for_mutant(name, path=data.path),
        )
        skipped = set(left_out)
        for data in {id(data): data for data, name, _ in mutants if name in skipped}.values():
            data.save()
        print(f"    {len(left_out)} known equivalents left out ({EQUIVALENTS.name})")
        return kept, by_path

    # _run looks the function up at each call: the run goes on as mutmut's own.
    mutmut_main.collect_source_file_mutation_data = collect_without_equivalents
    try:
        mutmut_main.cli.main(args=["run", *args], prog_name="mutmut", standalone_mode=False)
    except SystemExit as stop:
        return int(stop.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
