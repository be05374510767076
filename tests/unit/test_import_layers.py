"""The package's imports flow one way: ``config`` <- ``maintenance`` (the domain) <-
presentation (``render``) <- entry points (CLI, Dagster). Read from the source with ``ast``,
counting imports inside functions and under ``TYPE_CHECKING`` too: those hide a circle,
they do not remove it."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import icegate_dagster

ROOT = Path(icegate_dagster.__file__).parent
PACKAGE = "icegate_dagster"

#: Each top-level unit's layer: a module may import its own layer and those below it. The
#: domain below everything that uses it; above it the entry points: the exporter, then the
#: Dagster layer in its own order (resources <- assets <- sensors <- jobs <- definitions),
#: and the CLI, which records its passes in Dagster with the assets' vocabulary.
LAYERS = {
    "": 0,  # the package's own __init__: its docstring and version
    "errors": 0,
    "config": 1,
    "catalog": 2,
    "spark": 2,
    "maintenance": 3,
    "render": 4,
    "monitoring": 5,
    "resources": 6,
    "assets": 7,
    "sensors": 8,
    "jobs": 9,
    "cli": 10,
    "definitions": 11,
}
#: Any unit not listed: a new top-level unit fails
#: :func:`test_every_top_level_unit_has_a_layer` until placed.
ENTRY_POINTS = 12


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imported(module: str, path: Path) -> Iterator[str]:
    """Every name ``module`` imports (absolute, resolved to the longest known module for
    this package's own; third-party names as written)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base.pop()
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield target
            # ``from pkg import submodule`` imports the submodule.
            yield from (
                f"{target}.{alias.name}"
                for alias in node.names
                if f"{target}.{alias.name}" in MODULES
            )


def _own(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's own modules it imports."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        own = {_own(name) for name in _imported(module, path) if name.startswith(PACKAGE)}
        graph[module] = {name for name in own if name is not None and name != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _unit(module: str) -> str:
    """``icegate_dagster.maintenance.health.score`` -> ``maintenance``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _layer(module: str) -> int:
    return LAYERS.get(_unit(module), ENTRY_POINTS)


def _room(module: str) -> str:
    """A module's room inside ``maintenance``: its sub-package, or itself."""
    parts = module.split(".")
    return ".".join(parts[:3])


def test_the_graph_sees_imports_hidden_in_functions_and_type_checking_blocks() -> None:
    """The walker itself: a function-level import and a ``TYPE_CHECKING`` one both count."""
    graph = import_graph()
    # cli imports the deferred operations inside a function only.
    orphans_command = graph["icegate_dagster.cli.orphans"]
    assert "icegate_dagster.maintenance.ops.deferred_orphans" in orphans_command
    # render names TableHealth under TYPE_CHECKING only.
    assert "icegate_dagster.maintenance.health.score" in graph["icegate_dagster.render"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_top_level_unit_has_a_layer() -> None:
    """A new folder or top-level module is placed in :data:`LAYERS` deliberately."""
    units = {_unit(module) for module in MODULES} - {""}
    assert sorted(units - set(LAYERS)) == []


def test_the_dagster_layer_lives_in_its_folders() -> None:
    """Every module that imports Dagster is in ``resources/``, ``assets/``, ``sensors/``,
    ``jobs/`` or is ``definitions.py`` (the CLI's history of a pass, and the exporter's
    daemon probe, read an instance but define nothing of the code location)."""
    homes = {"resources", "assets", "sensors", "jobs", "definitions", "cli", "monitoring"}
    loose = sorted(
        module
        for module, path in MODULES.items()
        if _unit(module) not in homes
        for name in _imported(module, path)
        if name == "dagster" or name.startswith(("dagster.", "dagster_"))
    )
    assert loose == []


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert cycles(import_graph()) == []


def test_imports_go_down_the_layers_only() -> None:
    """Nothing imports a layer above its own: the domain never imports presentation or
    an entry point, presentation never an entry point, ``config`` only ``errors``."""
    upward = sorted(
        f"{module} -> {other}"
        for module, imported in import_graph().items()
        for other in imported
        if _layer(other) > _layer(module)
    )
    assert upward == []


def test_the_maintenance_layer_never_imports_dagster() -> None:
    """The CLI and the assets share one implementation: it must load without Dagster."""
    dagster = sorted(
        f"{module} imports {name}"
        for module, path in MODULES.items()
        if _unit(module) in ("maintenance", "config", "errors", "catalog", "spark")
        for name in _imported(module, path)
        if name == "dagster" or name.startswith(("dagster.", "dagster_"))
    )
    assert dagster == []


def test_the_rooms_of_maintenance_import_each_other_one_way() -> None:
    """Collapsed to its rooms (``health``, ``leases``, ``log``, ``ops``, ``orphans``,
    ``wal`` and the single modules), ``maintenance`` still has no circle; the package's
    own ``__init__`` (its public exports) is left out, as it re-exports from below."""
    prefix = f"{PACKAGE}.maintenance"
    rooms: dict[str, set[str]] = {}
    for module, imported in import_graph().items():
        if not module.startswith(prefix + "."):
            continue
        room = _room(module)
        rooms.setdefault(room, set()).update(
            _room(other)
            for other in imported
            if other.startswith(prefix + ".") and _room(other) != room
        )
    assert cycles(rooms) == []


@pytest.mark.parametrize("room", ["health", "leases", "log", "ops", "orphans", "trigger", "wal"])
def test_each_room_says_what_it_holds_and_may_import(room: str) -> None:
    init = ROOT / "maintenance" / room / "__init__.py"
    docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
    modules = sorted(p.stem for p in init.parent.glob("*.py") if p.name != "__init__.py")
    missing = [name for name in modules if f":mod:`.{name}`" not in docstring]
    assert missing == [], f"{room}/__init__.py does not describe {missing}"
    assert "May import" in docstring and "Never" in docstring
    # What it says it never imports, it does not.
    never = re.findall(r":mod:`\.\.(\w+)`", docstring.split("Never", 1)[1])
    prefix = f"{PACKAGE}.maintenance"
    broken = sorted(
        f"{module} -> {other}"
        for module, imported in import_graph().items()
        if _room(module) == f"{prefix}.{room}"
        for other in imported
        if _room(other) in {f"{prefix}.{name}" for name in never}
    )
    assert broken == []


def test_the_top_level_modules_stay_small_and_leave_spark_to_the_engine() -> None:
    """The package's loose modules are entry points and small shared pieces: none imports
    pyspark (the engine lives in ``spark/``) and none grows past 400 lines."""
    top = {m: p for m, p in MODULES.items() if p.parent == ROOT and p.name != "__init__.py"}
    spark = sorted(
        m for m, p in top.items() for name in _imported(m, p) if name.split(".")[0] == "pyspark"
    )
    assert spark == []
    sizes = {m: len(p.read_text().splitlines()) for m, p in top.items()}
    assert sorted(f"{m}: {n} lines" for m, n in sizes.items() if n > 400) == []


def test_bench_imports_no_circle() -> None:
    """``bench/`` (the harness at the bottom, benchmarks above it, the registry and CLI on
    top) has no circle either."""
    bench = ROOT.parent / "bench"
    names = {p.stem for p in bench.glob("*.py") if p.name != "__init__.py"}
    graph: dict[str, set[str]] = {}
    for path in bench.glob("*.py"):
        if path.name == "__init__.py":
            continue
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                if parts[0] == "bench" and len(parts) > 1:
                    imported.add(parts[1])
                elif parts == ["bench"]:
                    imported.update(a.name for a in node.names if a.name in names)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] == "bench" and len(parts) > 1:
                        imported.add(parts[1])
        graph[path.stem] = imported - {path.stem}
    assert cycles(graph) == []
