"""The store DSN a source reads from: the ``dsn`` option, else the workers' environment.

The caller sets the ``dsn`` option (lakefold's own readers always do). Spark shows data source
options in query plans, so a DSN with a password may instead be left to the environment of the
driver and the workers: ``LAKEFOLD_STORE_DSN``, else ``LAKEFOLD_DSN`` (the variables of
lakefold's settings, with their precedence and, like them, matched in any case). A source runs
in Spark's Python workers, below the application: it reads those two variables itself, never
the application's settings (so a ``lakefold.toml`` does not reach it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from lakefold.spark.exceptions import SparkTerminalError

# In order of precedence, as Settings.resolved_store_dsn: the store's DSN, else the source's.
_DSN_VARIABLES = ("LAKEFOLD_STORE_DSN", "LAKEFOLD_DSN")


def store_dsn_option(lowered_options: Mapping[str, str],
                     environ: Mapping[str, str] | None = None) -> str:
    """The DSN from the (lower-cased) options, or from the environment (``os.environ`` unless
    given); a clear error if neither."""
    dsn = lowered_options.get("dsn")
    if dsn:
        return dsn
    named = {name.upper(): value for name, value in (os.environ if environ is None
                                                     else environ).items()}
    environment_dsn = next((named[name] for name in _DSN_VARIABLES if name in named), None)
    if not environment_dsn:
        raise SparkTerminalError(
            "no store DSN for the source: pass .option('dsn', ...) or set LAKEFOLD_STORE_DSN "
            "(or LAKEFOLD_DSN) where Spark's driver and workers run"
        )
    return environment_dsn
