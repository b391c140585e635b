from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from devtools import mutation_leg

PYPROJECT = """
[tool.pytest.ini_options]
DJANGO_SETTINGS_MODULE = "config.settings"
addopts = "-p no:cacheprovider"
markers = ["slow: spawns real worker processes"]

[tool.mutmut]
source_paths = ["approvals"]
only_mutate = ["approvals/execution/ledger.py", "approvals/audit/chain.py"]
also_copy = ["config", "templates", "manage.py"]
pytest_add_cli_args = ["-q", "-m", "not slow"]
pytest_add_cli_args_test_selection = ["tests/approvals"]

[tool.mutation-legs.postgres]
only_mutate = ["approvals/audit/chain.py"]
pytest_add_cli_args_test_selection = ["tests/approvals/audit"]
"""


def _project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    for name in ("approvals", "config", "templates", "tests"):
        (root / name).mkdir(parents=True)
    (root / "manage.py").write_text("", "utf-8")
    (root / "pyproject.toml").write_text(PYPROJECT, "utf-8")
    return root


def test_prepare_writes_the_legs_settings_over_the_projects(tmp_path):
    root = _project(tmp_path)
    leg = tmp_path / "leg"

    mutation_leg.prepare(leg, leg="postgres", root=root)

    written = tomllib.loads((leg / "pyproject.toml").read_text("utf-8"))
    assert written["tool"]["mutmut"] == {
        "source_paths": ["approvals"],
        "only_mutate": ["approvals/audit/chain.py"],
        "also_copy": ["config", "templates", "manage.py"],
        "pytest_add_cli_args": ["-q", "-m", "not slow"],
        "pytest_add_cli_args_test_selection": ["tests/approvals/audit"],
    }
    assert written["tool"]["pytest"]["ini_options"] == {
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "addopts": "-p no:cacheprovider",
        "markers": ["slow: spawns real worker processes"],
    }
    assert "mutation-legs" not in written["tool"]


def test_prepare_links_the_code_mutmut_copies_and_the_tests(tmp_path):
    root = _project(tmp_path)
    leg = tmp_path / "leg"

    mutation_leg.prepare(leg, leg="postgres", root=root)
    mutation_leg.prepare(leg, leg="postgres", root=root)

    links = sorted(p.name for p in leg.iterdir() if p.is_symlink())
    assert links == ["approvals", "config", "manage.py", "templates", "tests"]
    assert (leg / "approvals").resolve() == (root / "approvals").resolve()


def test_prepare_refuses_to_replace_what_is_not_a_link(tmp_path):
    root = _project(tmp_path)
    leg = tmp_path / "leg"
    (leg / "approvals").mkdir(parents=True)

    with pytest.raises(FileExistsError, match="is in the way of a link"):
        mutation_leg.prepare(leg, leg="postgres", root=root)


def test_main_without_the_leg_exits_2_with_one_line(tmp_path, capsys):
    code = mutation_leg.main([str(tmp_path / "leg"), "--leg", "oracle"])

    assert code == 2
    assert capsys.readouterr().err == "pyproject.toml has no [tool.mutation-legs.oracle].\n"
