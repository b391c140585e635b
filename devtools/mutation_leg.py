"""The PostgreSQL leg of the mutation run (`make mutants`): a folder mutmut can run in.

The first leg runs on SQLite, which takes the audit chain's locked append; the one-statement
append that production takes on PostgreSQL (approvals.audit.chain._append_linked and its helpers)
is reached by no test there. mutmut keeps its copy of the project and its results in ./mutants and
reads its settings from ./pyproject.toml, so the second leg gets a folder of its own:
`python -m devtools.mutation_leg var/mutation-postgres` links the project's code and tests into it
and writes a pyproject.toml holding the project's pytest settings and its [tool.mutmut], with the
leg's own keys ([tool.mutation-legs.postgres]) over it. The score reads both legs' results
(devtools.mutation_score).
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def leg_settings(pyproject: dict[str, Any], leg: str) -> dict[str, Any]:
    """The leg's [tool.mutmut]: the project's, with the leg's own keys over it.

    Raises:
        KeyError: the project names no such leg.
    """
    tool = pyproject["tool"]
    return {**tool["mutmut"], **tool["mutation-legs"][leg]}


def linked_entries(settings: dict[str, Any]) -> list[str]:
    """What the leg's folder links to: the code mutmut copies, and the tests."""
    names = [*settings.get("source_paths", []), *settings.get("also_copy", []), "tests"]
    return list(dict.fromkeys(Path(name).parts[0] for name in names))


def _toml_table(name: str, values: dict[str, Any]) -> str:
    # JSON's strings, lists, numbers and booleans are TOML's too.
    lines = [f"[{name}]"] + [f"{key} = {json.dumps(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def prepare(folder: Path, *, leg: str, root: Path = ROOT) -> None:
    """Make (or bring up to date) the leg's folder: links to the project, its pyproject.toml.

    Raises:
        KeyError: the project names no such leg.
        FileExistsError: something that is not a link stands where a link must go.
    """
    pyproject = tomllib.loads((root / "pyproject.toml").read_text("utf-8"))
    settings = leg_settings(pyproject, leg)
    folder.mkdir(parents=True, exist_ok=True)
    for name in linked_entries(settings):
        link = folder / name
        if link.is_symlink():
            link.unlink()
        elif link.exists():
            raise FileExistsError(f"{link} is in the way of a link to {root / name}")
        link.symlink_to(root / name)
    text = (
        f"# Written by `python -m devtools.mutation_leg` for the {leg} leg of the mutation run.\n\n"
        + _toml_table("tool.pytest.ini_options", pyproject["tool"]["pytest"]["ini_options"])
        + "\n"
        + _toml_table("tool.mutmut", settings)
    )
    (folder / "pyproject.toml").write_text(text, "utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.mutation_leg")
    parser.add_argument("folder", type=Path, help="where the leg runs (var/mutation-postgres)")
    parser.add_argument("--leg", default="postgres", help="a table of [tool.mutation-legs]")
    args = parser.parse_args(argv)
    try:
        prepare(args.folder, leg=args.leg)
    except KeyError:
        print(f"pyproject.toml has no [tool.mutation-legs.{args.leg}].", file=sys.stderr)
        return 2
    except FileExistsError as error:
        print(error, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
