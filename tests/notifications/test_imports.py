"""The notifications modules import each other at module level only, and without a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import notifications

PACKAGE = Path(notifications.__file__).parent
# Django's app loading: receivers import models, which need the app registry first.
ALLOWED_IN_FUNCTIONS = {("apps", "receivers")}


def _imports() -> dict[str, list[tuple[str, bool]]]:
    """module -> [(notifications module it imports, whether at module level)]."""
    modules = {path.stem: path for path in PACKAGE.glob("*.py")}
    found: dict[str, list[tuple[str, bool]]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        top = {id(node) for node in tree.body}
        found[name] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "notifications":
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "notifications."
            ):
                targets = [node.module.split(".")[1]]
            elif isinstance(node, ast.Import):
                targets = [
                    a.name.split(".")[1] for a in node.names if a.name.startswith("notifications.")
                ]
            else:
                continue
            found[name] += [(t, id(node) in top) for t in targets if t in modules and t != name]
    return found


def test_imports_inside_functions_only_where_app_loading_needs_them():
    nested = {(m, t) for m, imports in _imports().items() for t, top in imports if not top}

    assert nested == ALLOWED_IN_FUNCTIONS


def test_no_import_cycle_even_counting_imports_inside_functions():
    graph = {m: {t for t, _ in imports} for m, imports in _imports().items()}
    done: set[str] = set()

    def cycle_from(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        for imported in sorted(graph[module]):
            found = cycle_from(imported, [*path, module])
            if found:
                return found
        done.add(module)
        return None

    assert [cycle for m in sorted(graph) if (cycle := cycle_from(m, []))] == []
