"""The store DSN a source reads from: the ``dsn`` option, else lakefold's settings.

Spark shows data source options in query plans, so a DSN with a password is better left to
the settings (``LAKEFOLD_STORE_DSN`` or ``LAKEFOLD_DSN`` in the environment of the driver and the
workers) than passed as an option.
"""

from __future__ import annotations

from collections.abc import Mapping

from lakefold.core.exceptions import ConfigurationError
from lakefold.spark.exceptions import SparkTerminalError


def store_dsn_option(lowered_options: Mapping[str, str]) -> str:
    """The DSN from the (lower-cased) options, or from the settings; a clear error if neither."""
    dsn = lowered_options.get("dsn")
    if dsn:
        return dsn
    from lakefold.settings import load_settings

    try:
        settings_dsn = load_settings().resolved_store_dsn()
    except ConfigurationError as e:
        raise SparkTerminalError(f"no store DSN for the source: {e}") from e
    if not settings_dsn:
        raise SparkTerminalError(
            "no store DSN for the source: pass .option('dsn', ...) or set LAKEFOLD_STORE_DSN "
            "(or LAKEFOLD_DSN) where Spark's driver and workers run"
        )
    return settings_dsn
