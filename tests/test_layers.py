"""The package map of docs/how-it-works.md holds: no import cycle, no layer imports a higher one.

Every import counts — at module level, under ``TYPE_CHECKING`` and inside functions — except a
package's ``__init__`` importing its own children (re-exports) and a child importing its parent
package (which runs the parent's ``__init__`` first anyway).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "extagg"
DOC = ROOT / "docs" / "how-it-works.md"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


MODULES = _modules()


def _layers() -> list[tuple[str, list[str]]]:
    """``(layer, module prefixes)`` rows of the doc's layer table, lowest first."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index("| layer | modules |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        layer, modules = (cell.strip() for cell in line.strip("|").split("|", 1))
        rows.append((layer, re.findall(r"`(extagg[\w.]*)`", modules)))
    return rows


LAYERS = _layers()


def _layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer index)
    for index, (_layer, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or module.startswith(prefix + ".")
            if matches and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def _imports(module: str) -> set[str]:
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for name in names:
            # the longest known module the name refers to
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if not name or name == module:
                continue
            if is_package and name.startswith(module + "."):
                continue  # a package re-exporting its children
            if module.startswith(name + "."):
                continue  # a child naming its parent package
            out.add(name)
    return out


GRAPH = {module: _imports(module) for module in MODULES}


def test_the_layer_table_places_every_module() -> None:
    assert len(LAYERS) >= 8, LAYERS
    unplaced = sorted(m for m in MODULES if _layer_of(m) is None)
    assert not unplaced, f"add these to the layer table of {DOC.name}: {unplaced}"


def test_no_module_imports_a_higher_layer() -> None:
    violations = []
    for module, targets in GRAPH.items():
        mine = _layer_of(module)
        for target in targets:
            theirs = _layer_of(target)
            if mine is not None and theirs is not None and theirs > mine:
                violations.append(
                    f"{module} ({LAYERS[mine][0]}) imports {target} ({LAYERS[theirs][0]})"
                )
    assert not violations, "\n".join(sorted(violations))


def test_no_import_cycles() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in GRAPH:
        if module not in index:
            visit(module)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_checks_catch_what_they_are_for() -> None:
    """The graph sees real edges (else every check above would pass vacuously)."""
    assert "extagg.spillable" in GRAPH["extagg.generic.external_map"]
    assert "extagg.memory.task" in GRAPH["extagg.memory.consumer"]
    assert _layer_of("extagg.memory.task") < _layer_of("extagg.columnar.hash_aggregator")
    assert _layer_of("extagg.columnar") == _layer_of("extagg.generic.merge_phase")
