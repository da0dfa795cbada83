"""Driver errors at the event store's boundary, turned into lakefold errors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import psycopg_pool

from lakefold.eventstore.exceptions import EventStoreNotInstalledError, EventStoreUnavailableError


def one_line(error: BaseException) -> str:
    """A driver error's text on one line (libpq adds hints on their own lines)."""
    return " ".join(str(error).split())


def raise_translated(error: BaseException, masked_dsn: str) -> None:
    """Raise the lakefold error for a connection, pool or missing-schema ``error`` (from it);
    return for any other error."""
    if isinstance(error, psycopg_pool.PoolTimeout):
        raise EventStoreUnavailableError(
            f"no connection to the event store at {masked_dsn} became free or could be opened "
            "in time; check the server, or raise StoreOptions.pool_size"
        ) from error
    if isinstance(error, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedFunction
                  | psycopg.errors.InvalidSchemaName):
        raise EventStoreNotInstalledError(
            f"the event store is not installed in {masked_dsn} ({error.diag.message_primary}); "
            "run EventStore(dsn).install() or `lakefold events install`"
        ) from error
    if isinstance(error, psycopg.OperationalError):
        raise EventStoreUnavailableError(
            f"the event store at {masked_dsn} failed: {type(error).__name__}: "
            f"{one_line(error)}; retry"
        ) from error


@contextmanager
def translate_errors(masked_dsn: str) -> Iterator[None]:
    """Turn connection and missing-schema errors into lakefold errors."""
    try:
        yield
    except (psycopg.Error, psycopg_pool.PoolTimeout) as e:
        raise_translated(e, masked_dsn)
        raise
