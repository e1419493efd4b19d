"""No attnlib module imports a module that imports it, directly or through others.

Every ``import`` and ``from ... import`` of every module is read with ``ast``,
wherever it stands (module level, inside a function, under ``TYPE_CHECKING``),
so a circle hidden in a function-level import is found too. ``from pkg import
name`` is an edge to the module ``pkg.name`` when there is one, else to
``pkg``; a package's ``__init__`` importing its own submodules is an edge like
any other, so a submodule that reads a constant from its package
(``from . import TARGET``) closes a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "attnlib"



def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, modules: set[str]) -> set[str]:
    """The attnlib modules that the module ``name`` (at ``path``) imports."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                submodule = f"{origin}.{alias.name}"
                found.add(submodule if submodule in modules else origin)
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_relative_and_function_level_imports(tmp_path):
    graph = import_graph()
    assert "attnlib._heads" in graph["attnlib.attention"]  # from ._heads import ...
    assert "attnlib" in graph["attnlib.bench._benchmark"]  # from .. import __version__
    assert "attnlib.bench._constants" in graph["attnlib.bench._cli"]  # from . import _constants
    source = tmp_path / "late.py"
    source.write_text("def f():\n    from .functional import softmax\n    import attnlib.viz\n")
    assert _imports("attnlib.late", source, set(graph)) == {"attnlib.functional", "attnlib.viz"}
    # The circle finder finds a circle of three.
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_module_imports_a_module_that_imports_it():
    found = [sorted(c) for c in circles(import_graph())]
    assert found == [], f"import circles: {found}"


def test_the_masks_module_is_a_leaf_that_functional_re_exports():
    # flash builds its tile masks with causal_mask, and functional imports flash: the
    # mask builders live in attnlib._masks, below both, and functional re-exports them
    import attnlib._masks
    import attnlib.functional

    assert import_graph()["attnlib._masks"] == {"attnlib._validation"}
    assert "attnlib._masks" in import_graph()["attnlib.flash"]
    for name in attnlib._masks.__all__:
        assert name in attnlib.functional.__all__
        assert getattr(attnlib.functional, name) is getattr(attnlib._masks, name)
