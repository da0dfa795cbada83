"""lakefold: change-data capture and event sourcing on PostgreSQL, projected by Spark.

The names below are imported lazily (PEP 562): ``import lakefold`` stays cheap, and Spark's Python
workers that import one source module do not pull in the whole platform.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakefold._lazy import lazy_getattr

if TYPE_CHECKING:
    from lakefold.exceptions import (
        ConfigurationError,
        LakefoldError,
        TerminalError,
        TransientError,
    )
    from lakefold.local import LocalPostgres, LocalRedis
    from lakefold.settings import Settings, load_settings
    from lakefold.spark import spark_session

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "ConfigurationError": "lakefold.exceptions",
    "LakefoldError": "lakefold.exceptions",
    "TerminalError": "lakefold.exceptions",
    "TransientError": "lakefold.exceptions",
    "LocalPostgres": "lakefold.local",
    "LocalRedis": "lakefold.local",
    "Settings": "lakefold.settings",
    "load_settings": "lakefold.settings",
    "spark_session": "lakefold.spark",
}

__all__ = [
    "ConfigurationError",
    "LakefoldError",
    "LocalPostgres",
    "LocalRedis",
    "Settings",
    "TerminalError",
    "TransientError",
    "load_settings",
    "spark_session",
]


__getattr__ = lazy_getattr("lakefold", _EXPORTS)


def __dir__() -> list[str]:
    return __all__
