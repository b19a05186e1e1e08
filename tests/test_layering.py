"""The import graph of the installed packages: no cycle, the core's packages in layers, and the
core imports no outer layer.

Every ``import`` in every module counts, at the top or inside a function (a lazy
import is still a dependency); imports under ``if TYPE_CHECKING:`` do not (they
never run).  An import of a package's submodule is an arrow to that submodule,
not to the packages above it.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

PACKAGES = ("autopar", "autopar_solver", "autopar_cache", "autopar_service")
OUTER = ("autopar_solver", "autopar_service", "autopar_cache")


def _modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations, package
        root = Path(next(iter(spec.submodule_search_locations)))
        for path in root.rglob("*.py"):
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _type_checking_only(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_names(module: str, path: Path) -> set[str]:
    """Absolute names of everything ``module`` imports (outside ``if TYPE_CHECKING:``)."""
    names: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if _type_checking_only(node):
            assert isinstance(node, ast.If)
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return names


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for name in _imported_names(module, path):
            if name in modules:
                targets.add(name)
            elif name.rpartition(".")[0] in modules and name.split(".")[0] in PACKAGES:
                targets.add(name.rpartition(".")[0])  # `from pkg.mod import function`
        # `from pkg import mod` yields both pkg and pkg.mod: keep the more precise arrow
        targets = {t for t in targets if not any(o.startswith(t + ".") for o in targets)}
        targets.discard(module)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_walk_sees_lazy_imports() -> None:
    graph = import_graph()
    assert "autopar.ir.graph" in graph["autopar.cli.args"]  # imported inside a function
    assert any(t.startswith("autopar_solver.planner") for t in graph["autopar_solver.cli"])  # likewise
    assert "autopar.rules.families" in graph["autopar.rules"]
    assert "autopar.hardware.mesh" not in graph["autopar.runtimes.oneflow_09.pricing"]  # TYPE_CHECKING only
    assert {"autopar.cli.main", "autopar_solver.cli", "autopar_service.cli", "autopar_cache.codec"} <= set(
        graph
    )


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_cycle_detection_finds_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_core_imports_no_outer_layer() -> None:
    arrows = sorted(
        f"{module} -> {target}"
        for module, targets in import_graph().items()
        if module.split(".")[0] == "autopar"
        for target in targets
        if target.split(".")[0] in OUTER
    )
    assert arrows == []


LAYERS: tuple[tuple[str, ...], ...] = (
    ("autopar.errors", "autopar.version"),
    ("autopar.infra",),
    ("autopar.hardware",),
    ("autopar.ir",),
    ("autopar.runtimes", "autopar.models", "autopar.client"),
    ("autopar.rules",),
    ("autopar.cost",),
    ("autopar.pipeline",),
    ("autopar.baselines",),
    ("autopar.bridges",),
    ("autopar.cli",),
    ("autopar",),
)
"""The core's packages (and its top-level modules), bottom up: a module imports only from its own
package and from the layers below it (docs/architecture.md).  ``autopar`` itself is the facade of
public names (``autopar.Graph``, ``autopar.Plan``, ...), above everything."""


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of the package (or top-level module) ``module`` belongs to."""
    parts = module.split(".")
    for depth in (2, 1):
        name = ".".join(parts[:depth])
        for i, members in enumerate(LAYERS):
            if name in members:
                return i
    raise AssertionError(f"{module} is in no layer of LAYERS: add its package there")


def test_every_core_module_has_a_layer() -> None:
    for module in import_graph():
        if module.split(".")[0] == "autopar":
            layer_of(module)


def test_the_core_imports_run_one_way() -> None:
    def package(m: str) -> str:
        return ".".join(m.split(".")[:2])

    upward = sorted(
        f"{module} -> {target}"
        for module, targets in import_graph().items()
        if module.split(".")[0] == "autopar"
        for target in targets
        if target.split(".")[0] == "autopar"
        and package(target) != package(module)
        and layer_of(target) >= layer_of(module)
    )
    assert upward == []


def test_the_layer_check_finds_an_upward_import() -> None:
    assert layer_of("autopar.ir.plan") > layer_of("autopar.hardware.mesh")
    assert layer_of("autopar.cost.evaluate") > layer_of("autopar.rules.registry")
    assert layer_of("autopar.baselines.plans") > layer_of("autopar.pipeline.plan")
    assert layer_of("autopar.runtimes.registry") == layer_of("autopar.models.builder")
