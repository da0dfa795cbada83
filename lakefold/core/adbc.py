"""Arrow reads from PostgreSQL through ADBC's low-level API.

The ADBC PostgreSQL driver runs a query as a binary ``COPY`` and decodes it into Arrow record
batches in C++, without holding the GIL. The snapshot movers (``capture``) and the event
store's Spark source (``spark``) read through it.

ADBC's DB-API module (``adbc_driver_postgresql.dbapi``) is not used: it imports pandas and
polars, which took 2.2 s in a fresh process, paid by every snapshot before its first chunk and
by every Spark Python worker before its first read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Self

import adbc_driver_manager
import adbc_driver_postgresql
import pyarrow as pa
from adbc_driver_manager import _reader

Error = adbc_driver_manager.Error
ProgrammingError = adbc_driver_manager.ProgrammingError


class Connection:
    """One autocommit connection; ``conninfo`` is a libpq connection string or URI."""

    def __init__(self, conninfo: str) -> None:
        self._database = adbc_driver_postgresql.connect(conninfo)
        try:
            self._connection = adbc_driver_manager.AdbcConnection(self._database)
        except BaseException:
            self._database.close()
            raise

    def execute(self, statement: str) -> None:
        """Run a statement that returns no rows."""
        with adbc_driver_manager.AdbcStatement(self._connection) as handle:
            handle.set_sql_query(statement)
            handle.execute_update()

    def batches(self, query: str, options: Mapping[str, str] | None = None,
                ) -> Iterator[pa.RecordBatch]:
        """The query's rows as record batches; ``options`` are ADBC statement options."""
        with adbc_driver_manager.AdbcStatement(self._connection) as handle:
            if options:
                handle.set_options(**options)
            handle.set_sql_query(query)
            stream, _ = handle.execute_query()
            reader = _reader.AdbcRecordBatchReader._import_from_c(stream.address)
            try:
                yield from reader
            finally:
                reader.close()

    def close(self) -> None:
        self._connection.close()
        self._database.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
