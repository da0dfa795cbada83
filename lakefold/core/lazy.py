"""Lazy package exports (PEP 562), shared by the packages whose ``__init__`` must stay cheap.

Spark's Python workers import single source modules, which runs their package's ``__init__``;
exporting names lazily keeps that from importing the whole platform.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, exports: Mapping[str, str],
                 modules: Mapping[str, str] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``exports`` maps a public name to the module
    that defines it, ``modules`` a public name to a module itself; the first access imports
    that module and caches the name."""

    def __getattr__(name: str) -> Any:
        if modules is not None and name in modules:
            value = importlib.import_module(modules[name])
            setattr(sys.modules[package], name, value)
            return value
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


def by_module(exports: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    """``{module: (name, ...)}`` (each name listed once, under its module) as ``lazy_getattr``'s
    ``{name: module}``."""
    return {name: module for module, names in exports.items() for name in names}
