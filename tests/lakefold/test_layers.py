"""Layers point one way, and no two modules import each other (see ARCHITECTURE.md).

Every product module (pyproject's package-dir map) is parsed with ``ast``; every import counts —
at the top, inside functions, under ``TYPE_CHECKING``, ``importlib.import_module("lakefold...")``
with a literal name, and the module names of a package's lazy exports (``lazy_getattr``). A
module may import its own package or any lower layer; an import of a higher layer (upward) or of
another package of the same layer (sideways) fails, naming the file, the line and both layers.
Import cycles between modules fail too, counting every import but the ``TYPE_CHECKING`` ones.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The layers, lowest first. projections/ is in rooms (each room's docstring says what it may
# import); the application's rooms sit at the top: the demo, and above it the CLI (which runs
# the demo); nothing below imports either.
LAYERS = ("core", "schemas", "store", "capture/spark",
          "projections errors", "projections definitions", "projections state", "projections plan",
          "projections operators/targets", "projections runtime", "projections face",
          "application", "demo", "cli")
(CORE, SCHEMAS, STORE, CAPTURE_SPARK, P_ERRORS, P_SPEC, P_STATE, P_PLAN, P_EXECUTE, P_RUNTIME,
 PROJECTIONS, APPLICATION, DEMO, CLI) = range(len(LAYERS))

# Module-name prefix -> (layer, package). The longest matching prefix wins; two packages in one
# layer must not import each other. Edit this table, not the checker.
LAYER_MAP: dict[str, tuple[int, str]] = {
    "lakefold.core": (CORE, "core"),
    "lakefold.schemas": (SCHEMAS, "schemas"),
    "lakefold.eventstore": (STORE, "eventstore"),
    # The changelog store is importable without the replication code (test_rooms), so it sits
    # below capture and spark: spark's changelog source reads through it.
    "lakefold.store": (STORE, "changelog store"),
    "lakefold.capture": (CAPTURE_SPARK, "capture"),
    "lakefold.spark": (CAPTURE_SPARK, "spark"),
    "lakefold.projections": (PROJECTIONS, "projections"),
    "lakefold.projections.exceptions": (P_ERRORS, "projections errors"),
    "lakefold.projections.definitions": (P_SPEC, "projections definitions"),
    "lakefold.projections.state": (P_STATE, "projections state"),
    "lakefold.projections.plan": (P_PLAN, "projections plan"),
    # operators and targets are siblings: neither imports the other
    "lakefold.projections.operators": (P_EXECUTE, "projections operators"),
    "lakefold.projections.targets": (P_EXECUTE, "projections targets"),
    "lakefold.projections.runtime": (P_RUNTIME, "projections runtime"),
    # The application's services: the facade, settings, _from_settings, local services, _bench,
    # console.
    "lakefold": (APPLICATION, "application"),
    # The application's rooms (their __init__ docstrings say what they own and may import).
    "lakefold.demo": (DEMO, "demo"),
    "lakefold.cli": (CLI, "cli"),
}

# What the root of lakefold/ itself may hold: the facade and the services; the rest is in rooms
# (cli/, demo/, console/, _bench/, core/ and the packages of package-dir).
ROOT_MODULES = frozenset({"lakefold", "lakefold._from_settings", "lakefold.local",
                          "lakefold.settings"})

# Module cycles still open, each exactly as found (the test fails on an entry that is no longer
# a cycle). None today: keep it so.
ALLOWED_CYCLES: frozenset[frozenset[str]] = frozenset()


@dataclass(frozen=True)
class Import:
    importer: str
    path: Path
    line: int
    target: str
    type_only: bool


def product_modules(root: Path) -> dict[str, Path]:
    """Every module of the packages in ``root``'s pyproject package-dir map, by dotted name."""
    with (root / "pyproject.toml").open("rb") as f:
        package_dir: dict[str, str] = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    modules: dict[str, Path] = {}
    for package, folder in package_dir.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _is_lakefold(name: str) -> bool:
    return name == "lakefold" or name.startswith("lakefold.")


def _literal_module(call: ast.Call) -> str | None:
    """The literal module name of ``importlib.import_module("...")`` or ``__import__("...")``."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in {"import_module", "__import__"} or not call.args:
        return None
    first = call.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def _module_dict(tree: ast.Module, name: str) -> ast.expr | None:
    """The value last assigned to ``name`` at the top of the module."""
    value = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            value = node.value
        elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
              and node.target.id == name and node.value is not None):
            value = node.value
    return value


def _lazy_exports(call: ast.Call, tree: ast.Module) -> Iterator[tuple[str, int]]:
    """The modules (and lines) a ``lazy_getattr(package, exports)`` call imports on attribute
    access: ``exports`` a dict literal, a module-level dict's name, or a comprehension
    ``{name: f"lakefold.x.{module}" for name, module in EXPORTS.items()}``."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name != "lazy_getattr" or len(call.args) < 2:
        return
    exports: ast.expr | None = call.args[1]
    prefix = ""
    if isinstance(exports, ast.DictComp) and len(exports.generators) == 1:
        value, loop = exports.value, exports.generators[0]
        if (isinstance(value, ast.JoinedStr) and len(value.values) == 2
                and isinstance(value.values[0], ast.Constant)
                and isinstance(value.values[0].value, str)
                and isinstance(loop.iter, ast.Call) and isinstance(loop.iter.func, ast.Attribute)
                and loop.iter.func.attr == "items"):
            prefix, exports = value.values[0].value, loop.iter.func.value
    grouped = False  # ``by_module({module: (name, ...)})``: the modules are the keys
    if isinstance(exports, ast.Call) and getattr(exports.func, "id", None) == "by_module" \
            and len(exports.args) == 1:
        grouped, exports = True, exports.args[0]
    for keyword in call.keywords:  # ``modules={name: module}``: modules exported whole
        given: ast.expr | None = keyword.value
        if isinstance(given, ast.Name):
            given = _module_dict(tree, given.id)
        if keyword.arg == "modules" and isinstance(given, ast.Dict):
            for entry in given.values:
                if isinstance(entry, ast.Constant) and isinstance(entry.value, str):
                    yield entry.value, entry.lineno
    found: ast.expr | None = exports
    if isinstance(found, ast.Name):
        found = _module_dict(tree, found.id)
    if isinstance(found, ast.Dict):
        entries: list[ast.expr | None] = list(found.keys) if grouped else list(found.values)
        for item in entries:
            if isinstance(item, ast.Constant) and isinstance(item.value, str):
                yield prefix + item.value, item.lineno


def imports_of(module: str, path: Path, modules: Mapping[str, Path]) -> list[Import]:
    """Every import of a lakefold module in ``path``, resolved to a module of ``modules`` where
    ``from package import name`` names a submodule, else to the package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: list[Import] = []

    def add(target: str, line: int, type_only: bool) -> None:
        if _is_lakefold(target):
            found.append(Import(module, path, line, target, type_only))

    def visit(node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for statement in node.body:
                visit(statement, True)
            for statement in node.orelse:
                visit(statement, type_only)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno, type_only)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in modules else base, node.lineno, type_only)
        elif isinstance(node, ast.Call):
            literal = _literal_module(node)
            if literal is not None:
                add(literal, node.lineno, type_only)
            for name, line in _lazy_exports(node, tree):
                add(name, line, type_only)
        for child in ast.iter_child_nodes(node):
            visit(child, type_only)

    visit(tree, False)
    return found


def layer_of(module: str, layer_map: Mapping[str, tuple[int, str]]) -> tuple[int, str]:
    prefixes = [p for p in layer_map if module == p or module.startswith(p + ".")]
    if not prefixes:
        raise AssertionError(f"{module} matches no prefix of the layer map: add it")
    return layer_map[max(prefixes, key=len)]


def layer_violations(
    imports: list[Import], layer_map: Mapping[str, tuple[int, str]], root: Path
) -> list[str]:
    """Each upward or sideways import, as ``file:line: importer (layer) -> target (layer)``."""
    problems = []
    for imp in imports:
        low, own = layer_of(imp.importer, layer_map)
        high, other = layer_of(imp.target, layer_map)
        if high > low or (high == low and own != other):
            kind = "upward" if high > low else "sideways"
            problems.append(
                f"{imp.path.relative_to(root)}:{imp.line}: {imp.importer} (layer {LAYERS[low]}, "
                f"{own}) imports {imp.target} (layer {LAYERS[high]}, {other}): {kind}"
            )
    return problems


def cycles(imports: list[Import], modules: Mapping[str, Path]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan), runtime imports only."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for imp in imports:
        if not imp.type_only and imp.target in modules and imp.target != imp.importer:
            graph[imp.importer].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def connect(node: str) -> None:  # recursion depth is bounded by the module count
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for name in sorted(graph):
        if name not in index:
            connect(name)
    return found


def all_imports(modules: Mapping[str, Path]) -> list[Import]:
    return [imp for name, path in modules.items() for imp in imports_of(name, path, modules)]


def _describe(component: frozenset[str], imports: list[Import], root: Path) -> str:
    edges = sorted({
        f"  {imp.path.relative_to(root)}:{imp.line}: {imp.importer} -> {imp.target}"
        for imp in imports
        if not imp.type_only and imp.importer in component and imp.target in component
    })
    return "cycle " + ", ".join(sorted(component)) + ":\n" + "\n".join(edges)


# The product tree.

def test_every_module_has_a_layer() -> None:
    modules = product_modules(REPO)
    assert {"lakefold.cli", "lakefold.cli._main", "lakefold.demo", "lakefold.demo._shop",
            "lakefold.core.exceptions", "lakefold.spark._session"} <= set(modules)
    for name in modules:
        layer_of(name, LAYER_MAP)


def test_the_root_of_lakefold_holds_only_the_facade_and_the_services() -> None:
    """A new command group goes to ``lakefold/cli/``, a demo module to ``lakefold/demo/``."""
    loose = {name for name, path in product_modules(REPO).items()
             if path.parent == REPO / "lakefold"}
    assert loose == ROOT_MODULES, f"give these a room: {sorted(loose - ROOT_MODULES)}"


def test_imports_point_down_the_layers() -> None:
    modules = product_modules(REPO)
    problems = layer_violations(all_imports(modules), LAYER_MAP, REPO)
    assert not problems, "imports against the layers:\n" + "\n".join(problems)


# The packages whose private modules (a name part starting with "_") no other package imports:
# what one package needs of another is in that package's face, its ``internals`` (for lakefold's
# own packages) or ``operations`` (for the application). The application is one package.
PACKAGES = ("lakefold.core", "lakefold.schemas", "lakefold.store", "lakefold.eventstore",
            "lakefold.capture", "lakefold.spark", "lakefold.projections", "lakefold")


def package_of(module: str) -> str:
    return max((p for p in PACKAGES if module == p or module.startswith(p + ".")), key=len)


def private_imports(imports: list[Import], root: Path) -> list[str]:
    """Each import of another package's private module, as ``file:line: importer -> target``."""
    found = []
    for imp in imports:
        own, other = package_of(imp.importer), package_of(imp.target)
        below = imp.target[len(other):].split(".")
        if own != other and any(part.startswith("_") for part in below):
            found.append(f"{imp.path.relative_to(root)}:{imp.line}: {imp.importer} -> "
                         f"{imp.target}")
    return found


def test_no_package_imports_another_packages_private_module() -> None:
    modules = product_modules(REPO)
    found = private_imports(all_imports(modules), REPO)
    assert not found, "private imports across packages (use the package's internals):\n" + \
        "\n".join(found)


def test_checker_finds_private_imports_across_packages(tmp_path: Path) -> None:
    modules = _tree(tmp_path, {
        "spark/_a.py": "from lakefold.spark._b import x\n",  # its own package: fine
        "spark/_b.py": "",
        "spark/internals.py": "",
        "projections/_p.py": "from lakefold.spark._b import x\n"
                             "from lakefold.spark.internals import x\n",
    })
    found = private_imports(all_imports(modules), tmp_path)
    assert [f.split(": ")[0] for f in found] == ["projections/_p.py:1"], found


def test_no_import_cycles_between_modules() -> None:
    modules = product_modules(REPO)
    imports = all_imports(modules)
    found = set(cycles(imports, modules))
    unexpected = [_describe(c, imports, REPO) for c in sorted(found - ALLOWED_CYCLES, key=sorted)]
    assert not unexpected, "import cycles:\n" + "\n".join(unexpected)
    stale = sorted(sorted(c) for c in ALLOWED_CYCLES - found)
    assert not stale, f"no longer cycles, remove them from ALLOWED_CYCLES: {stale}"


# The checker itself, on a small tree: it must see what it is there to catch.

def _tree(root: Path, files: dict[str, str]) -> dict[str, Path]:
    (root / "pyproject.toml").write_text(
        '[tool.setuptools]\npackage-dir = { "lakefold" = "lakefold", "lakefold.spark" = "spark",'
        ' "lakefold.projections" = "projections" }\n'
    )
    for name, text in {"lakefold/__init__.py": "", "lakefold/core/__init__.py": "",
                       "spark/__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return product_modules(root)


def test_checker_catches_every_kind_of_upward_import(tmp_path: Path) -> None:
    modules = _tree(tmp_path, {
        "lakefold/settings.py": "",
        "lakefold/core/fine.py": "from lakefold.core import lazy\n",
        "lakefold/core/lazy.py": "",
        "spark/_top.py": "from lakefold.settings import load_settings\n",
        "spark/_inner.py": "def f():\n    from lakefold import settings\n",
        "spark/_typed.py": "from typing import TYPE_CHECKING\n"
                           "if TYPE_CHECKING:\n    import lakefold.settings\n",
        "spark/_dynamic.py": "import importlib\nimportlib.import_module('lakefold.settings')\n",
        "spark/_relative.py": "from .. import settings\n",
        "spark/__init__.py": "from lakefold.core.lazy import lazy_getattr\n"
                             "_EXPORTS = {'X': 'lakefold.settings'}\n"
                             "__getattr__ = lazy_getattr('lakefold.spark', _EXPORTS)\n",
    })
    assert set(modules) >= {"lakefold", "lakefold.core.fine", "lakefold.spark._top"}
    problems = layer_violations(all_imports(modules), LAYER_MAP, tmp_path)
    culprits = sorted(p.split(":")[0] for p in problems)
    assert culprits == [
        "spark/__init__.py", "spark/_dynamic.py", "spark/_inner.py", "spark/_relative.py",
        "spark/_top.py", "spark/_typed.py",
    ], problems
    assert "spark/_top.py:1: lakefold.spark._top (layer capture/spark, spark) imports " \
           "lakefold.settings (layer application, application): upward" in problems


def test_checker_catches_sideways_imports_and_cycles(tmp_path: Path) -> None:
    modules = _tree(tmp_path, {
        "lakefold/core/a.py": "from lakefold.core import b\n",
        "lakefold/core/b.py": "def f():\n    import lakefold.core.c\n",
        "lakefold/core/c.py": "from lakefold.core.a import x\n",
        "lakefold/core/d.py": "from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from lakefold.core import a\n",
        "lakefold/core/e.py": "from lakefold.core import d\n",
        "lakefold/capture/__init__.py": "from lakefold.core.lazy import lazy_getattr\n"
                                        "_EXPORTS = {'Z': '_z'}\n"
                                        "__getattr__ = lazy_getattr('lakefold.capture', {\n"
                                        "    n: f'lakefold.projections.{m}'"
                                        " for n, m in _EXPORTS.items()"
                                        "})\n",
        "lakefold/capture/_x.py": "from lakefold.spark import Y\n",
        "lakefold/spark/__init__.py": "",
    })
    imports = all_imports(modules)
    assert cycles(imports, modules) == [
        frozenset({"lakefold.core.a", "lakefold.core.b", "lakefold.core.c"})
    ]
    problems = layer_violations(imports, LAYER_MAP, tmp_path)
    assert [p.split(": ", 1)[0] for p in problems] == [
        "lakefold/capture/__init__.py:2", "lakefold/capture/_x.py:1"
    ], problems
    assert problems[0].endswith(
        "imports lakefold.projections._z (layer projections face, projections): upward")
    assert problems[1].endswith("imports lakefold.spark (layer capture/spark, spark): sideways")


def test_checker_keeps_the_rooms_of_projections_in_order(tmp_path: Path) -> None:
    modules = _tree(tmp_path, {
        "projections/__init__.py": "from lakefold.projections.runtime import _r\n",
        "projections/exceptions.py": "",
        "projections/definitions/_s.py": "from lakefold.projections.exceptions import E\n",
        "projections/plan/_p.py": "from lakefold.projections.definitions import _s\n"
                                  "from lakefold.projections.runtime import _r\n",
        "projections/operators/_o.py": "from lakefold.projections.targets import _t\n",
        "projections/targets/_t.py": "from lakefold.projections.state import _st\n",
        "projections/state/_st.py": "",
        "projections/runtime/_r.py": "from lakefold.projections.operators import _o\n"
                                     "from lakefold.projections import View\n",
    })
    problems = layer_violations(all_imports(modules), LAYER_MAP, tmp_path)
    assert sorted(p.split(": ", 1)[0] for p in problems) == [
        "projections/operators/_o.py:1", "projections/plan/_p.py:2",
        "projections/runtime/_r.py:2"], problems
    kinds = {p.split(": ", 1)[0]: p.rsplit(": ", 1)[1] for p in problems}
    assert kinds == {"projections/operators/_o.py:1": "sideways",
                     "projections/plan/_p.py:2": "upward",
                     "projections/runtime/_r.py:2": "upward"}


def test_checker_keeps_the_cli_and_the_demo_at_the_top(tmp_path: Path) -> None:
    modules = _tree(tmp_path, {
        "lakefold/settings.py": "",
        "lakefold/cli/__init__.py": "from lakefold.demo import run_demo\n"
                                    "from lakefold import settings\n",
        "lakefold/demo/__init__.py": "from lakefold.settings import load_settings\n",
        "lakefold/demo/_shop.py": "def f():\n    from lakefold.cli import main\n",
        "lakefold/console/__init__.py": "from lakefold.demo import _shop\n",
        "lakefold/_bench/__init__.py": "import importlib\n"
                                       "importlib.import_module('lakefold.cli')\n",
        "spark/_x.py": "from lakefold.demo._shop import SCHEMA\n",
    })
    problems = layer_violations(all_imports(modules), LAYER_MAP, tmp_path)
    assert sorted(p.split(": ", 1)[0] for p in problems) == [
        "lakefold/_bench/__init__.py:2", "lakefold/console/__init__.py:1",
        "lakefold/demo/_shop.py:2", "spark/_x.py:1",
    ], problems
    assert "lakefold/console/__init__.py:1: lakefold.console (layer application, application) " \
           "imports lakefold.demo._shop (layer demo, demo): upward" in problems
