"""mkdocs hooks (mkdocs.yml ``hooks:``): the API reference reads the one ``lakefold`` namespace.

pyproject's package-dir maps the top-level folders (capture/, spark/, ...) to ``lakefold.*`` at
install time; griffe, which mkdocstrings uses to read the docstrings, cannot follow that mapping
any more than mypy can. So the build links the same mirror ``make lint`` type-checks
(``.typecheck/lakefold``, see infra/typecheck_tree.py) before any page is rendered, and
mkdocs.yml points mkdocstrings at it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def on_startup(**_: Any) -> None:
    """Link .typecheck/lakefold (idempotent; no network, nothing outside the repository)."""
    spec = importlib.util.spec_from_file_location("typecheck_tree", ROOT / "infra" /
                                                  "typecheck_tree.py")
    assert spec is not None and spec.loader is not None  # noqa: S101 - a file of this repository
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main()
