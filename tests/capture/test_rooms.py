"""The rooms of ``lakefold.capture`` and the one-way imports between them.

The changelog store is a package of its own below capture (``lakefold.store``, importable alone:
Spark's workers and every reader load only it; ``lakefold.capture.store`` is its deprecated
alias). Lowest first: the alias, the package's shared modules (``exceptions``, ``_options``,
``_config``), ``decoding``, ``snapshots``, ``operations``, and the package's ``__init__``. A
module imports only modules of its own room or of rooms below it, and no module imports itself
back through others: every import counts, including those inside functions and under
``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

CAPTURE = "lakefold.capture"
_spec = importlib.util.find_spec(CAPTURE)
assert _spec is not None and _spec.submodule_search_locations is not None
ROOT = Path(next(iter(_spec.submodule_search_locations)))

# room -> rank; a module may import modules of the same or a lower rank only
RANKS = {"store": 0, "exceptions": 1, "_options": 1, "_config": 1, "decoding": 2,
         "snapshots": 3, "operations": 4, "__init__": 5}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((CAPTURE, *parts))


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Every lakefold module ``path`` imports, anywhere in it; ``from pkg import sub`` counts as
    importing ``pkg.sub`` when that is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m == "lakefold" or m.startswith("lakefold.")}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, name, known) for name, path in modules.items()}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else "__init__"


def test_the_store_imports_only_core_schemas_and_itself() -> None:
    spec = importlib.util.find_spec("lakefold.store")
    assert spec is not None and spec.submodule_search_locations is not None
    root = Path(next(iter(spec.submodule_search_locations)))
    allowed = ("lakefold.core", "lakefold.schemas", "lakefold.store")
    wrong = {f"{path.name} imports {target}" for path in sorted(root.rglob("*.py"))
             for target in _imports(path, "lakefold.store._x", set())
             if not target.startswith(allowed)}
    assert not wrong, sorted(wrong)


def test_rooms_import_only_rooms_below_them() -> None:
    wrong = set()
    for module, targets in _graph().items():
        for target in targets:
            if target.startswith(f"{CAPTURE}.") or target == CAPTURE:
                if RANKS[_room(target)] > RANKS[_room(module)]:
                    wrong.add(f"{module} imports {target}")
    assert not wrong, sorted(wrong)


def test_no_import_cycles_inside_capture() -> None:
    graph = {m: {t for t in ts if t in _modules()} for m, ts in _graph().items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target):], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert not cycles, [" -> ".join(c) for c in cycles]


def _loaded_after(code: str, package: str = CAPTURE) -> list[str]:
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd="/")
    return [m for m in json.loads(out.stdout) if m.startswith(f"{package}.") or m == package]


def test_the_store_loads_without_replication_decoding_snapshots_or_operations() -> None:
    code = ("from lakefold.store import ChangelogStore, read_changelog_range\n"
            "from lakefold.store import StoreError, ReaderBehindCompactionError\n"
            "assert ChangelogStore and read_changelog_range and StoreError\n"
            "assert ReaderBehindCompactionError")
    assert "lakefold.store._changelog_store" in _loaded_after(code, "lakefold.store")
    assert _loaded_after(code) == []  # no module of lakefold.capture


def test_the_old_store_path_still_works_and_says_it_is_deprecated() -> None:
    import warnings

    import lakefold.store

    old = importlib.import_module(f"{CAPTURE}.store")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert old.ChangelogStore is lakefold.store.ChangelogStore
        assert old.StreamInfo is lakefold.store.ChangelogStreamInfo  # renamed on the way
    assert any("lakefold.store" in str(w.message) for w in caught)
    assert any("ChangelogStreamInfo" in str(w.message) for w in caught)


def test_importing_capture_is_cheap_and_its_names_resolve_lazily() -> None:
    assert _loaded_after("import lakefold.capture") == [CAPTURE]
    import lakefold.capture as capture

    assert set(capture.__all__) == set(capture._EXPORTS)
    for name in capture.__all__:
        assert getattr(capture, name) is not None
    for room in ("lakefold.store", f"{CAPTURE}.decoding", f"{CAPTURE}.snapshots",
                 f"{CAPTURE}.operations"):
        package = importlib.import_module(room)
        for name in package.__all__:
            assert getattr(package, name) is not None
