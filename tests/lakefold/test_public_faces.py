"""The public faces: every name in an ``__all__`` resolves, the root offers the projection API a
user writes with, and the application (CLI, benches, demo) uses no private module or name of
another package."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FACES = [
    "lakefold",
    "lakefold.eventstore",
    "lakefold.eventstore.arrow",
    "lakefold.eventstore.recorder",
    "lakefold.projections",
    "lakefold.projections.operations",
    "lakefold.spark",
    "lakefold.spark.operations",
    "lakefold.schemas",
]

# Port internals a user does not need: they live in a sanctioned module, not the package face.
INTERNALS = {
    "lakefold.eventstore": {"LogQuery", "StreamQuery", "Sealed", "WatermarkHolder", "Waiter",
                            "EVENTS_ARROW_SCHEMA", "read_events_range"},
    "lakefold.projections": {"Catalog", "Generation", "SinkRoots", "registering_into"},
    "lakefold.schemas": {"payload_schema", "spark_compatible"},
}


@pytest.mark.parametrize("face", FACES)
def test_every_name_in_all_resolves(face: str) -> None:
    module = importlib.import_module(face)
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing
    assert len(set(module.__all__)) == len(module.__all__)


@pytest.mark.parametrize("face", sorted(INTERNALS))
def test_a_face_lists_no_port_internals(face: str) -> None:
    assert not INTERNALS[face] & set(importlib.import_module(face).__all__)


def test_the_root_offers_the_projection_api() -> None:
    import lakefold
    from lakefold import projections

    for name in ("projection", "Fold", "view", "changelog", "events", "delta_table",
                 "redis_cache", "search_index"):
        assert name in lakefold.__all__
        assert getattr(lakefold, name) is getattr(projections, name)


def _application_files() -> list[Path]:
    folder = ROOT / "lakefold"
    return sorted([*(folder / "cli").glob("*.py"), *(folder / "demo").glob("*.py"),
                   *(folder / "_bench").glob("*.py"),
                   *(folder / "console").glob("*.py")])


#: The packages below the application; every other ``lakefold.X`` is the application's own.
PACKAGES = ("core", "schemas", "eventstore", "capture", "spark", "projections")


def _private_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
            continue
        module = node.module
        if not module.startswith("lakefold."):
            continue
        parts = module.split(".")
        if parts[1] not in PACKAGES:
            continue  # the application's own modules
        if any(part.startswith("_") for part in parts[1:]):
            found.append(f"{path.name}: from {module} import ...")
        found += [f"{path.name}: {module}.{a.name}" for a in node.names
                  if a.name.startswith("_")]
    return found


def test_the_application_imports_no_private_name_of_another_package() -> None:
    found = [hit for path in _application_files() for hit in _private_imports(path)]
    assert not found
