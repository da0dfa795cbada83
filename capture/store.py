"""Deprecated alias of ``lakefold.store`` (the changelog store moved out of capture, which is
one of its users, in round three); removed in the next release. Import ``lakefold.store``, or
the names ``lakefold.capture`` exports."""

from __future__ import annotations

import warnings
from typing import Any

#: Names that changed on the way (old → new).
_RENAMED = {"StreamInfo": "ChangelogStreamInfo"}


def __getattr__(name: str) -> Any:
    if name.startswith("__"):  # a tool probing the module (``__all__``, ``__path__``)
        raise AttributeError(name)
    import lakefold.store

    new = _RENAMED.get(name, name)
    warnings.warn(f"lakefold.capture.store is deprecated: import {new} from lakefold.store",
                  DeprecationWarning, stacklevel=2)
    return getattr(lakefold.store, new)
