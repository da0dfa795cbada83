"""The initial snapshot: every captured table's rows as ``read`` records, consistent with the
slot, copied in primary-key chunks that survive a crash.

Hand-over (no gap, no duplicate)
    The capture creates its slot with ``SNAPSHOT 'export'`` and, while the replication
    connection stays idle (which keeps the exported snapshot alive), copies the rows inside
    that snapshot (``SET TRANSACTION SNAPSHOT``). The snapshot shows the database exactly at
    the slot's consistent point, and the slot sends exactly the transactions that commit
    after it; the stream continues after the ``read`` records.

Chunks
    Each table is copied in chunks of ``SnapshotPolicy.chunk_rows`` rows in key order. The chunk
    boundaries are planned inside the snapshot, so chunk ``k`` holds exactly ``chunk_rows``
    rows and its positions are known in advance; ``SnapshotPolicy.workers`` movers copy chunks
    in parallel, each with its own connections importing the same snapshot. A chunk is read
    as Arrow text columns (ADBC: binary ``COPY`` decoded in C++, without the GIL), stored as
    snapshot segments (``_snapshot_segments``: a few compressed rows per chunk instead of a
    changelog row per source row) and committed beyond the stream head, where readers do not see it.
    Then, in chunk order, one store transaction per chunk moves the head over it and records
    its progress (``capture_snapshot_tables.last_key``). Records beyond the head left by a
    crash are deleted when the snapshot resumes.

Resume
    After a crash the exported snapshot is gone. The next ``Capture.run`` finishes the
    remaining key ranges with incremental (locked, in-stream) chunks, see ``_incremental_snapshot``:
    every row copied before the crash was read at the consistent point and is followed by
    all its later changes; every row read after it is consistent at its own point of the
    stream. Nothing is copied twice, nothing is missed.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Protocol

import psycopg
import pyarrow as pa
from psycopg import sql

from lakefold.capture.decoding import _publishable
from lakefold.capture.decoding._replication_connection import SESSION_OPTIONS
from lakefold.capture.decoding._source_catalog import SourceCatalog
from lakefold.capture.exceptions import (
    ConnectionLostError,
    SourceConfigurationError,
    StoreError,
)
from lakefold.capture.snapshots._table_shape import TableShape, capture_tables, table_shape
from lakefold.core import adbc
from lakefold.core.dsn import error_text, mask_dsn
from lakefold.store.internals import (
    NOTIFY_CHANNEL,
    ChangelogWriter,
    capture_state as state,
    snapshot_segments,
    translate_store_error,
)

if TYPE_CHECKING:
    from lakefold.capture._config import CaptureConfig

log = logging.getLogger(__name__)

# A chunk is stored as segments of at most this much text (before compression), so a table of
# large rows does not make one huge segment.
_SEGMENT_BYTES: Final = 32 << 20


class SnapshotListener(Protocol):
    """Progress of a snapshot (the CLI draws a progress bar with rows/s from it)."""

    def table_started(self, table: str, estimated_rows: int, done_rows: int) -> None: ...

    def rows_copied(self, table: str, rows: int) -> None: ...

    def table_done(self, table: str, rows: int) -> None: ...


class QuietListener:
    """A listener that logs at debug level only."""

    def table_started(self, table: str, estimated_rows: int, done_rows: int) -> None:
        log.debug("snapshot of %s: about %d rows (%d done)", table, estimated_rows, done_rows)

    def rows_copied(self, table: str, rows: int) -> None:
        del table, rows

    def table_done(self, table: str, rows: int) -> None:
        log.info("snapshot of %s done: %d rows", table, rows)


@dataclass(frozen=True, slots=True)
class SnapshotStats:
    """What one snapshot run (or part of it) did."""

    snapshot_id: int
    tables: int
    rows: int
    chunks: int
    elapsed_s: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.elapsed_s if self.elapsed_s > 0 else 0.0


def _source_conninfo(dsn: str) -> str:
    """``dsn`` with session settings that give values the same text form as pgoutput's
    (``_replication_connection.SESSION_OPTIONS``)."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    params["options"] = f"{params.get('options', '')} {SESSION_OPTIONS}".strip()
    params.setdefault("connect_timeout", "10")
    params.setdefault("application_name", "lakefold-snapshot")
    return psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]


def source_connection(dsn: str, *, autocommit: bool) -> psycopg.Connection[Any]:
    """A connection to the source with the session settings of ``_source_conninfo``."""
    try:
        return psycopg.connect(_source_conninfo(dsn), autocommit=autocommit)
    except psycopg.OperationalError as e:
        raise ConnectionLostError(f"cannot connect to the source at {mask_dsn(dsn)}: "
                                  f"{error_text(e)}") from e


def estimated_rows(conn: psycopg.Connection[Any], relid: int) -> int:
    row = conn.execute("SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = %s",
                       (relid,)).fetchone()
    return int(row[0]) if row else 0


def plan_initial(store: psycopg.Connection[Any], source: psycopg.Connection[Any],
                 config: CaptureConfig, *, consistent_lsn: int) -> int:
    """Record the initial snapshot of every table the capture's publication publishes (the
    publishable tables of its scope, see ``_publishable``); returns the snapshot id."""
    relids = sorted(_publishable.published(source, config.publication))
    tables = []
    for relid in capture_tables(source, relids):
        row = source.execute(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE c.oid = %s", (relid,)).fetchone()
        if row is not None:
            tables.append((relid, row[0], row[1], f"{config.stream_prefix}{row[0]}.{row[1]}"))
    state.install(store)
    return state.create_run(store, slot=config.slot, kind="initial",
                            consistent_lsn=consistent_lsn, tables=tables)


def copy_exported(config: CaptureConfig, snapshot_id: int, snapshot_name: str, *,
                  database: str, listener: SnapshotListener | None = None) -> SnapshotStats:
    """Copy the run's tables inside the exported snapshot ``snapshot_name`` (see the module
    docstring), with ``SnapshotPolicy.workers`` parallel movers. Marks the run done."""
    try:
        return _copy_exported(config, snapshot_id, snapshot_name, database=database,
                              listener=listener or QuietListener())
    except psycopg.Error as e:  # the run stays unfinished: the next Capture.run resumes it
        raise translate_store_error(e, "the source or the store",
                                    "copy the initial snapshot") from e


def _copy_exported(config: CaptureConfig, snapshot_id: int, snapshot_name: str, *,
                   database: str, listener: SnapshotListener) -> SnapshotStats:
    started = time.monotonic()
    rows = chunks = 0
    store_dsn = config.resolved_store_dsn
    with source_connection(config.source_dsn, autocommit=False) as src, \
            psycopg.connect(store_dsn, autocommit=True, connect_timeout=10) as store:
        src.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        src.read_only = True
        src.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))
        run = next(r for r in state.runs(store, config.slot) if r.snapshot_id == snapshot_id)
        lsn = run.consistent_lsn or 0
        at = run.created_at
        writer = ChangelogWriter(store, config.slot)
        catalog = SourceCatalog(src, database=database)
        tables = state.run_tables(store, snapshot_id)
        movers = _Movers(config, snapshot_name)
        try:
            for table in tables:
                if table.status == "done":
                    continue
                try:
                    copied, n = _copy_table(src, store, writer, catalog, config, table, movers,
                                            lsn=lsn, at=at, database=database,
                                            listener=listener)
                except SourceConfigurationError:  # created after the slot's snapshot
                    log.info("table %s is not in the slot's snapshot; its rows come from the "
                             "stream", table.qualified)
                    state.record_chunk(store, snapshot_id, table.relid, last_key=None,
                                       rows=0, done=True)
                    continue
                rows += copied
                chunks += n
        finally:
            movers.close()
        src.rollback()
        state.finish_run(store, snapshot_id)
    return SnapshotStats(snapshot_id, len(tables), rows, chunks, time.monotonic() - started)


def register_stream(writer: ChangelogWriter, catalog: SourceCatalog,
                    shape: TableShape, *, name: str, database: str,
                    lsn: int) -> tuple[int, int, tuple[str, ...]]:
    """Create the table's stream and register its schema exactly as the first Relation
    message would; returns (stream id, schema version, key columns in column order)."""
    stream_id = writer.ensure_stream(name, database=database, schema=shape.schema,
                                     table=shape.table)
    schema = catalog.relation_schema(shape.relation(), stream=name)
    version = writer.register_schema(stream_id, schema, lsn=lsn)
    return stream_id, version, schema.key_columns


def boundary(conn: psycopg.Connection[Any], shape: TableShape, after: tuple[str, ...] | None,
             rows: int) -> tuple[str, ...] | None:
    """The key of the ``rows``-th row after ``after`` (None: fewer rows remain)."""
    query = sql.SQL("SELECT {} FROM {} {} ORDER BY {} OFFSET {} LIMIT 1").format(
        shape.order_key_text(), shape.ident, _after_clause(shape, after), shape.order_by(),
        sql.Literal(rows - 1))
    row = conn.execute(query, list(after) if after is not None else None).fetchone()
    return None if row is None else tuple(str(v) for v in row)


def _after_clause(shape: TableShape, after: tuple[str, ...] | None) -> sql.Composable:
    if after is None:
        return sql.SQL("")
    return sql.SQL("WHERE {} > {}").format(shape.order_tuple(), shape.placeholders())


def _range_literal(shape: TableShape, lo: tuple[str, ...] | None,
                   hi: tuple[str, ...] | None) -> sql.Composable:
    """``WHERE key > lo AND key <= hi`` with the keys as untyped literals (COPY takes no
    parameters; the server casts the literals to the key columns' types)."""
    conditions = []
    for op, key in ((">", lo), ("<=", hi)):
        if key is not None:
            conditions.append(sql.SQL("{} {} ({})").format(
                shape.order_tuple(), sql.SQL(op),
                sql.SQL(", ").join(sql.Literal(v) for v in key)))
    if not conditions:
        return sql.SQL("")
    return sql.SQL("WHERE ") + sql.SQL(" AND ").join(conditions)


@dataclass(frozen=True, slots=True)
class _Chunk:
    """One chunk to copy: its SELECT of the rows as text, in key order, and where its records
    go (``first`` holds the first row's position and ordinal, the rest count up)."""

    table: str
    select: str
    first: snapshot_segments.Segment
    key_indexes: tuple[int, ...]


class _Mover:
    """One worker's connections: the source inside the exported snapshot (ADBC), and the
    store."""

    def __init__(self, config: CaptureConfig, snapshot_name: str) -> None:
        try:
            self.src = adbc.Connection(_source_conninfo(config.source_dsn))
            self.src.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            self.src.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(
                sql.Literal(snapshot_name)).as_string(None))
        except adbc.Error as e:
            raise ConnectionLostError(
                f"cannot read the snapshot from the source at {mask_dsn(config.source_dsn)}: "
                f"{str(e).strip()}") from e
        self.store = psycopg.connect(config.resolved_store_dsn, autocommit=True,
                                     connect_timeout=10)

    def move(self, chunk: _Chunk) -> int:
        """Read one chunk and store it as segments in one store transaction (beyond the stream
        head: invisible until the coordinator moves the head); returns its rows."""
        first = chunk.first
        rows = 0
        try:
            with self.store.transaction(), self.store.cursor() as cur:
                batches: list[pa.RecordBatch] = []
                # batches of a quarter segment, so a segment ends near _SEGMENT_BYTES
                for batch in self.src.batches(chunk.select, {
                        "adbc.postgresql.batch_size_hint_bytes": str(_SEGMENT_BYTES // 4)}):
                    batches.append(batch)
                    if sum(b.nbytes for b in batches) >= _SEGMENT_BYTES:
                        rows += self._store(cur, first, rows, batches, chunk.key_indexes)
                        batches = []
                rows += self._store(cur, first, rows, batches, chunk.key_indexes)
        except adbc.Error as e:
            raise ConnectionLostError(f"reading a snapshot chunk of {chunk.table} from the "
                                      f"source failed: {str(e).strip()}") from e
        return rows

    @staticmethod
    def _store(cur: psycopg.Cursor[Any], first: snapshot_segments.Segment, offset: int,
               batches: list[pa.RecordBatch], key_indexes: tuple[int, ...]) -> int:
        n = int(sum(b.num_rows for b in batches))
        if n:
            segment = replace(first, first_position=first.first_position + offset,
                              last_position=first.first_position + offset + n - 1,
                              first_ordinal=first.first_ordinal + offset)
            snapshot_segments.write(cur, segment, pa.Table.from_batches(batches), key_indexes)
        return n

    def close(self) -> None:
        self.src.close()
        self.store.close()


class _Movers:
    """A pool of ``_Mover`` threads, one per ``SnapshotPolicy.workers``."""

    def __init__(self, config: CaptureConfig, snapshot_name: str) -> None:
        self._config = config
        self._snapshot = snapshot_name
        self._local = threading.local()
        self._all: list[_Mover] = []
        self._lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=config.snapshot.workers,
                                       thread_name_prefix="lakefold-snapshot")

    def move(self, chunk: _Chunk) -> int:
        mover = getattr(self._local, "mover", None)
        if mover is None:
            mover = _Mover(self._config, self._snapshot)
            self._local.mover = mover
            with self._lock:
                self._all.append(mover)
        return mover.move(chunk)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        for mover in self._all:
            mover.close()


def _copy_table(src: psycopg.Connection[Any], store: psycopg.Connection[Any],
                writer: ChangelogWriter, catalog: SourceCatalog, config: CaptureConfig,
                table: state.SnapshotTable, movers: _Movers, *, lsn: int, at: datetime,
                database: str, listener: SnapshotListener) -> tuple[int, int]:
    """Copy one table: the main connection plans chunk boundaries (exact inside the
    snapshot, so chunk ``k`` holds ``chunk_rows`` rows and its positions are known before it
    is read), the movers copy chunks in parallel, and the head and progress advance over the
    chunks done without a gap, each step in one store transaction."""
    n_rows = config.snapshot.chunk_rows
    shape = table_shape(src, table.relid)
    stream_id, version, key_columns = register_stream(
        writer, catalog, shape, name=table.stream, database=database, lsn=lsn)
    listener.table_started(table.qualified, estimated_rows(src, table.relid), table.rows)
    row = store.execute(
        "SELECT greatest(head, lakefold.changelog_top(stream_id)) "
        "FROM lakefold.changelog_streams WHERE stream_id = %s", (stream_id,)).fetchone()
    base = int(row[0] or 0) if row else 0
    key_indexes = tuple(i for i, c in enumerate(shape.columns) if c.name in key_columns)

    def chunk(k: int, lo: tuple[str, ...] | None, hi: tuple[str, ...] | None) -> _Chunk:
        select = sql.SQL("SELECT {} FROM {} {} ORDER BY {}").format(
            shape.text_columns(), shape.ident, _range_literal(shape, lo, hi), shape.order_by())
        first = snapshot_segments.Segment(stream_id, base + k * n_rows + 1,
                                           base + (k + 1) * n_rows,
                                           table.rows + k * n_rows + 1, lsn, at, version)
        return _Chunk(table.qualified, select.as_string(src), first, key_indexes)

    pending: dict[int, tuple[Future[int], tuple[str, ...] | None]] = {}
    done_upto = 0  # chunks 0 .. done_upto-1 are counted in the head and the progress
    copied = 0
    lo, k, planned_all = table.last_key, 0, False
    while not planned_all or pending:
        while not planned_all and len(pending) < 2 * config.snapshot.workers:
            hi = boundary(src, shape, lo, n_rows)
            pending[k] = (movers.pool.submit(movers.move, chunk(k, lo, hi)), hi)
            planned_all = hi is None
            lo, k = hi, k + 1
        future, hi = pending[done_upto]
        n = future.result()
        del pending[done_upto]
        if hi is not None and n != n_rows:
            raise StoreError(f"snapshot chunk {done_upto} of {table.qualified} copied {n} rows, "
                             f"not {n_rows}; the snapshot is not stable (was it released?)")
        with store.transaction():
            if n:
                store.execute(
                    "WITH moved AS (UPDATE lakefold.changelog_streams SET head = %s, "
                    "last_commit_ts = greatest(last_commit_ts, %s) WHERE stream_id = %s "
                    "RETURNING name) SELECT pg_notify(%s, name) FROM moved",
                    (base + done_upto * n_rows + n, at, stream_id, NOTIFY_CHANNEL))
                store.execute("UPDATE lakefold.capture_slots SET records = records + %s "
                              "WHERE slot_name = %s", (n, config.slot))
            state.record_chunk(store, table.snapshot_id, table.relid, last_key=hi, rows=n,
                               done=hi is None)
        copied += n
        done_upto += 1
        listener.rows_copied(table.qualified, n)
    listener.table_done(table.qualified, table.rows + copied)
    return copied, done_upto


def utc_now() -> datetime:
    return datetime.now(UTC)

