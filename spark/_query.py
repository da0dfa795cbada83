"""SQL over the materialized tables: Spark SQL, or a fast local engine without a JVM.

Every table of a ``TableCatalog`` is registered under its name (a Spark temporary view over the
Delta snapshot's files, or a polars lazy Delta scan), so a query sees each table at the version
that was current when the query started. Results come back as an Arrow table.

Errors are turned into lakefold errors at this boundary: a table the query names but the
catalog does not know becomes ``UnknownTableError`` listing the known tables; a statement Spark
cannot parse or analyse becomes ``QueryError`` with Spark's own message and no JVM stack trace.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from enum import StrEnum
from typing import TYPE_CHECKING

import pyarrow as pa

from lakefold.core.object_store import storage_options_for
from lakefold.spark._catalog import TableCatalog
from lakefold.spark._delta_read import load_snapshot, read_delta
from lakefold.spark.exceptions import QueryError, SparkTerminalError, UnknownTableError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# PySpark logs every analysis error, with the full JVM stack trace, on these loggers before
# raising it; the error itself is re-raised below with Spark's message, so the log is a
# duplicate of it with a JVM trace attached.
_PYSPARK_CONTEXT_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")


class Engine(StrEnum):
    """``spark``: Spark SQL (the full dialect, any size). ``local``: polars SQL in this process,
    no JVM; for small interactive queries."""

    SPARK = "spark"
    LOCAL = "local"


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


@contextlib.contextmanager
def no_duplicate_error_logs() -> Iterator[None]:
    """Silence pyspark's own ERROR log of a failing query's context (with a JVM stack trace)
    while lakefold turns the error into its own message."""
    from pyspark.logger import PySparkLogger

    # Created as pyspark creates them: a plain Logger made here first would stay the one
    # pyspark gets, and pyspark's own calls on it (with keywords only its class takes) fail.
    loggers: list[logging.Logger] = [PySparkLogger.getLogger(name)
                                     for name in _PYSPARK_CONTEXT_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def register_tables(spark: SparkSession, catalog: TableCatalog) -> dict[str, str]:
    """Register every catalog table as a temporary view; return name → path (``read_delta``:
    delta-spark reads the tables only it can read, when the session has it)."""
    tables = dict(catalog.tables())
    for name, path in tables.items():
        read_delta(spark, path).createOrReplaceTempView(_quote(name))
    return tables


def _unknown_table(name: str, tables: dict[str, str]) -> UnknownTableError:
    known = ", ".join(sorted(tables)) or "none (materialize a projection first)"
    return UnknownTableError(f"unknown table {name}; known tables: {known}")


def query_spark(spark: SparkSession, sql_text: str, catalog: TableCatalog) -> pa.Table:
    """Run Spark SQL over the catalog's tables and return the result as Arrow."""
    from pyspark.errors import AnalysisException, ParseException

    if not sql_text.strip():
        raise QueryError("the query is empty; pass a SQL statement such as 'SELECT 1'")
    tables = register_tables(spark, catalog)
    try:
        with no_duplicate_error_logs():
            frame = spark.sql(sql_text)
            return frame.toArrow()
    except ParseException as e:
        # str() keeps Spark's pointer into the statement; there is no JVM trace in it.
        raise QueryError(f"cannot parse the query: {e}".strip()) from None
    except AnalysisException as e:
        if e.getCondition() == "TABLE_OR_VIEW_NOT_FOUND":
            name = (e.getMessageParameters() or {}).get("relationName", "?")
            raise _unknown_table(name, tables) from None
        raise QueryError(f"cannot run the query: {e.getMessage()}") from None


def query_local(sql_text: str, catalog: TableCatalog) -> pa.Table:
    """Run the query with polars SQL over lazy Delta scans: no JVM, starts in well under a
    second; for small interactive queries (polars' SQL dialect, close to PostgreSQL's)."""
    import polars as pl

    if not sql_text.strip():
        raise QueryError("the query is empty; pass a SQL statement such as 'SELECT 1'")
    tables = dict(catalog.tables())
    context = pl.SQLContext()
    for name, path in tables.items():
        snapshot = load_snapshot(path)
        if snapshot.files:
            frame = pl.scan_delta(path, version=snapshot.version,
                                  storage_options=storage_options_for(path))
        else:  # polars cannot scan a Delta table that has no files yet
            frame = pl.from_arrow(snapshot.schema.empty_table()).lazy()  # type: ignore[union-attr]
        context.register(name, frame)
    try:
        result = context.execute(sql_text).collect()
    except pl.exceptions.SQLInterfaceError as e:
        known = ", ".join(sorted(tables)) or "none"
        raise QueryError(f"cannot run the query: {e}; known tables: {known}") from None
    except (pl.exceptions.SQLSyntaxError, pl.exceptions.PolarsError) as e:
        raise QueryError(f"cannot run the query: {e}") from None
    return result.to_arrow()


def run_query(sql_text: str, catalog: TableCatalog, *, engine: Engine = Engine.SPARK,
              spark: SparkSession | None = None) -> pa.Table:
    """Run ``sql_text`` over every table of ``catalog`` with the chosen engine."""
    if engine is Engine.LOCAL:
        return query_local(sql_text, catalog)
    if spark is None:
        raise SparkTerminalError("the spark engine needs a SparkSession; pass spark=...")
    return query_spark(spark, sql_text, catalog)
