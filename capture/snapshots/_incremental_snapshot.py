"""Incremental snapshots: re-read tables while the capture keeps streaming (DBLog's idea, with
row locks instead of a watermark window).

For each chunk of a table, in key order, one short source transaction:

1. ``LOCK TABLE ... IN ROW SHARE MODE`` (only DDL waits for it), read the table's shape;
2. ``SELECT ... FOR SHARE SKIP LOCKED`` the chunk's rows (READ COMMITTED: the newest committed
   version of each row, now locked against UPDATE and DELETE);
3. still holding the locks, write the rows into the WAL as non-transactional logical decoding
   messages (``_inband_messages``); the capture turns them into ``read`` records at that point of
   the stream;
4. commit, releasing the locks.

Every change of a locked row committed before step 3 is already in the row; every later one
had to wait for step 4, so it follows the ``read`` record in the stream. The stream is never
paused and writers wait at most for one chunk. Rows that writers held locked at step 2 are
skipped and retried (``SnapshotPolicy.lock_retries`` rounds, then waiting for each row's lock
up to ``lock_timeout``, which never deadlocks since nothing else is held). Rows inserted or
deleted meanwhile need no read: their own insert or delete records carry them.

Progress (the last chunk's key) is stored after each chunk, so an interrupted run resumes after
its last chunk; at most one chunk is read twice (a restatement of the same rows). A run is
executed by one process at a time (advisory lock on the store).

The same procedure finishes an initial snapshot that was interrupted by a crash (``resume``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import psycopg
from psycopg import errors, sql

from lakefold.capture.decoding import _publishable
from lakefold.capture.decoding._inband_messages import (
    SNAPSHOT_PREFIX,
    ChunkHeader,
    encode_chunk,
    encode_tuple,
)
from lakefold.capture.decoding._pgoutput import pg_time
from lakefold.capture.exceptions import (
    CaptureTerminalError,
    SlotError,
    SourceConfigurationError,
)
from lakefold.capture.snapshots._initial_snapshot import (
    QuietListener,
    SnapshotListener,
    SnapshotStats,
    boundary,
    estimated_rows,
    source_connection,
    utc_now,
)
from lakefold.capture.snapshots._table_shape import (
    TableShape,
    capture_tables,
    find_table,
    table_shape,
)
from lakefold.core.dsn import mask_dsn
from lakefold.core.exceptions import TerminalError
from lakefold.store.internals import capture_state as state, translate_store_error

if TYPE_CHECKING:
    from lakefold.capture._config import CaptureConfig

log = logging.getLogger(__name__)

_RUN_LOCK: Final = 0x6C66736E  # "lfsn"
_FETCH: Final = 256
Key = tuple[str, ...]


def resnapshot(config: CaptureConfig, tables: Sequence[str], *,
               listener: SnapshotListener | None = None) -> SnapshotStats:
    """Re-read ``tables`` (``schema.table``) of a capture into their streams while the
    capture keeps streaming (see the module docstring); returns when every chunk is in the
    source's WAL (the capture stores them as it reaches them, now or when it next runs).

    Raises CaptureError when a table is not captured by ``config``'s publication, or when the
    store has no record of the slot.
    """
    with _store_connection(config) as store:
        # the run is claimed in the transaction that records it: a running capture, which
        # finishes runs whose process died, never sees it unclaimed
        snapshot_id = _plan(store, config, tables, claim=True)
        return _execute(store, config, snapshot_id, listener=listener, stop=None)


def plan_resnapshot(config: CaptureConfig, tables: Sequence[str]) -> int:
    """Check that every table of ``tables`` can be re-snapshotted by ``config``'s capture and
    record the run (the id returned; ``run_locked`` executes it, or a running capture does if
    it gets there first). Raises CaptureError, having recorded nothing, for a table the
    capture does not cover (or that does not exist), or a slot the store does not know."""
    with _store_connection(config) as store:
        return _plan(store, config, tables, claim=False)


def _store_connection(config: CaptureConfig) -> psycopg.Connection[Any]:
    return psycopg.connect(config.resolved_store_dsn, autocommit=True, connect_timeout=10)


def _plan(store: psycopg.Connection[Any], config: CaptureConfig, tables: Sequence[str], *,
          claim: bool) -> int:
    if not tables:
        raise CaptureTerminalError("name at least one table to re-snapshot (schema.table)")
    with source_connection(config.source_dsn, autocommit=True) as src:
        _check_slot(store, src, config)
        planned: list[tuple[int, str, str, str]] = []
        for name in tables:
            relid = find_table(src, name)
            for leaf in capture_tables(src, [relid]):
                schema, table = _names(src, leaf)
                _check_published(src, config.publication, leaf, schema, table)
                planned.append((leaf, schema, table, f"{config.stream_prefix}{schema}.{table}"))
    state.install(store)
    with store.transaction():
        snapshot_id = state.create_run(store, slot=config.slot, kind="incremental",
                                       consistent_lsn=None, tables=planned)
        if claim:  # a session lock: held after the commit, until the connection closes
            store.execute("SELECT pg_advisory_lock(%s, %s)", (_RUN_LOCK, snapshot_id))
    return snapshot_id


def resume(config: CaptureConfig, *, listener: SnapshotListener | None = None,
           kinds: tuple[str, ...] = ("initial", "incremental"),
           stop: threading.Event | None = None) -> list[SnapshotStats]:
    """Finish the slot's unfinished snapshot runs of ``kinds`` (an initial snapshot interrupted
    by a crash, an incremental one whose process died), oldest first. Runs another process is
    executing are left to it; ``stop`` ends the work after the current chunk (the runs stay
    unfinished and resume later)."""
    with psycopg.connect(config.resolved_store_dsn, autocommit=True,
                         connect_timeout=10) as store:
        pending = [r for r in state.runs(store, config.slot, status="running")
                   if r.kind in kinds]
    done = []
    for run in pending:
        if stop is not None and stop.is_set():
            break
        log.info("resuming %s snapshot %d of slot %s", run.kind, run.snapshot_id, config.slot)
        stats = run_locked(config, run.snapshot_id, listener=listener, stop=stop)
        if stats is not None:
            done.append(stats)
    return done


def run_locked(config: CaptureConfig, snapshot_id: int, *,
               listener: SnapshotListener | None = None,
               stop: threading.Event | None = None) -> SnapshotStats | None:
    """Execute (or continue) snapshot run ``snapshot_id`` with locked in-stream chunks; None
    when another process holds the run or has finished it. ``stop`` interrupts it after a
    chunk (unfinished)."""
    with _store_connection(config) as store:
        got = store.execute("SELECT pg_try_advisory_lock(%s, %s)",
                            (_RUN_LOCK, snapshot_id)).fetchone()
        if not got or not got[0]:
            return None
        if not any(r.snapshot_id == snapshot_id
                   for r in state.runs(store, config.slot, status="running")):
            return None  # finished by its holder between our look and the lock
        return _execute(store, config, snapshot_id, listener=listener, stop=stop)


def _execute(store: psycopg.Connection[Any], config: CaptureConfig, snapshot_id: int, *,
             listener: SnapshotListener | None,
             stop: threading.Event | None) -> SnapshotStats:
    """Execute run ``snapshot_id``, whose lock ``store``'s session holds."""
    listener = listener or QuietListener()
    started = time.monotonic()
    rows = chunks = 0
    tables = state.run_tables(store, snapshot_id)
    run = next(r for r in state.runs(store, config.slot) if r.snapshot_id == snapshot_id)
    if run.kind == "initial":
        _drop_unfinished_chunks(store, tables)
    try:
        with source_connection(config.source_dsn, autocommit=False) as src:
            for table in tables:
                if table.status == "done":
                    continue
                if run.kind == "incremental" and not _published(src, store, config, table):
                    continue
                copied, n = _table(src, store, config, table, listener, stop)
                rows += copied
                chunks += n
                if stop is not None and stop.is_set():
                    return SnapshotStats(snapshot_id, len(tables), rows, chunks,
                                         time.monotonic() - started)
    except psycopg.Error as e:
        error = translate_store_error(e, "the source or the store", "re-snapshot a table")
        if isinstance(error, TerminalError) and run.kind == "incremental":
            state.finish_run(store, snapshot_id, error=str(error))
        raise error from e
    except TerminalError as e:
        if run.kind == "incremental":  # an initial run stays due: the capture retries it
            state.finish_run(store, snapshot_id, error=str(e))
        raise
    state.finish_run(store, snapshot_id)
    return SnapshotStats(snapshot_id, len(tables), rows, chunks, time.monotonic() - started)


def _published(src: psycopg.Connection[Any], store: psycopg.Connection[Any],
               config: CaptureConfig, table: state.SnapshotTable) -> bool:
    """Whether the capture's publication still publishes ``table``; a table that left it
    before its re-snapshot (a run planned when it joined, see ``_inband_messages``) is marked done
    without reading it: its rows are read when it joins again."""
    with src.transaction():
        if table.relid in _publishable.published(src, config.publication):
            return True
    log.warning("table %s is no longer in publication %r; its re-snapshot is skipped (it is "
                "re-snapshotted when it joins again)", table.qualified, config.publication)
    state.record_chunk(store, table.snapshot_id, table.relid, last_key=None, rows=0, done=True)
    return False


def _drop_unfinished_chunks(store: psycopg.Connection[Any],
                            tables: list[state.SnapshotTable]) -> None:
    """Delete records beyond the head of the run's streams: chunks an interrupted initial
    snapshot copied but did not count yet (nothing else writes these streams before the
    initial snapshot is finished)."""
    names = [t.stream for t in tables if t.status != "done"]
    if not names:
        return
    row = store.execute(
        "SELECT lakefold.changelog_drop_beyond_head(array(SELECT stream_id "
        "FROM lakefold.changelog_streams WHERE name = ANY(%s)))", (names,)).fetchone()
    if row is not None and row[0] > 0:
        log.info("dropped %d records of unfinished snapshot chunks", row[0])


def _names(conn: psycopg.Connection[Any], relid: int) -> tuple[str, str]:
    row = conn.execute("SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n "
                       "ON n.oid = c.relnamespace WHERE c.oid = %s", (relid,)).fetchone()
    if row is None:
        raise SourceConfigurationError(f"table with OID {relid} disappeared from the source")
    return str(row[0]), str(row[1])


def _check_slot(store: psycopg.Connection[Any], src: psycopg.Connection[Any],
                config: CaptureConfig) -> None:
    try:
        row = store.execute("SELECT publication FROM lakefold.capture_slots WHERE slot_name = %s",
                            (config.slot,)).fetchone()
    except errors.UndefinedTable:
        row = None
    if row is None:
        raise SlotError(
            f"the store at {mask_dsn(config.resolved_store_dsn)} has no capture with slot "
            f"{config.slot!r}; start the capture first (lakefold capture run), then re-snapshot")
    exists = src.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s "
                         "AND database = current_database()", (config.slot,)).fetchone()
    if exists is None:
        raise SlotError(
            f"replication slot {config.slot!r} does not exist on the source; run `lakefold "
            "capture drop` for it and capture again (with an initial snapshot)")


def _check_published(src: psycopg.Connection[Any], publication: str, relid: int,
                     schema: str, table: str) -> None:
    row = src.execute("SELECT 1 FROM pg_publication_tables WHERE pubname = %s "
                      "AND schemaname = %s AND tablename = %s",
                      (publication, schema, table)).fetchone()
    if row is not None:
        return
    root = src.execute(
        "SELECT format('%%I.%%I', n.nspname, c.relname) FROM pg_partition_root(%s::regclass) r "
        "JOIN pg_class c ON c.oid = r JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE r <> %s::regclass", (relid, relid)).fetchone()
    if root is not None:
        raise CaptureTerminalError(
            f"table {schema}.{table} is a partition of {root[0]}, whose stream holds its rows "
            f"(partitions are captured via their root); re-snapshot {root[0]}")
    raise CaptureTerminalError(
        f"table {schema}.{table} is not captured (not in publication {publication!r}); "
        "re-snapshot only tables the capture covers")


def _table(src: psycopg.Connection[Any], store: psycopg.Connection[Any], config: CaptureConfig,
           table: state.SnapshotTable, listener: SnapshotListener,
           stop: threading.Event | None = None) -> tuple[int, int]:
    policy = config.snapshot
    try:
        with src.transaction():
            shape = table_shape(src, table.relid)
            estimate = estimated_rows(src, table.relid)
    except SourceConfigurationError:
        log.warning("table %s was dropped before its snapshot finished; skipped",
                    table.qualified)
        state.record_chunk(store, table.snapshot_id, table.relid, last_key=None, rows=0,
                           done=True)
        return 0, 0
    listener.table_started(table.qualified, estimate, table.rows)
    lo = table.last_key
    copied = chunks = 0
    pending: set[Key] = set()
    while True:
        with src.transaction():
            shape = lock_table(src, table.relid, policy.lock_timeout.total_seconds())
            hi = boundary(src, shape, lo, policy.incremental_chunk_rows)
            where, params = _range(shape, lo, hi)
            sent, skipped = _chunk(src, shape, config, table.snapshot_id, where, params, None)
        pending |= skipped
        copied += sent
        chunks += 1
        state.record_chunk(store, table.snapshot_id, table.relid, last_key=hi, rows=sent,
                           done=False)
        listener.rows_copied(table.qualified, sent)
        if hi is None:
            break
        if stop is not None and stop.is_set():
            return copied, chunks
        lo = hi
    retried = _retry(src, config, table, pending, listener)
    state.record_chunk(store, table.snapshot_id, table.relid, last_key=None, rows=retried,
                       done=True)
    listener.table_done(table.qualified, table.rows + copied + retried)
    return copied + retried, chunks


def lock_table(src: psycopg.Connection[Any], relid: int, timeout_s: float) -> TableShape:
    """Take ROW SHARE on the table (so its shape cannot change during the chunk), then read
    the shape."""
    src.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(
        sql.Literal(f"{int(timeout_s * 1000)}ms")))
    schema, table = _names(src, relid)
    try:
        src.execute(sql.SQL("LOCK TABLE {} IN ROW SHARE MODE").format(
            sql.Identifier(schema, table)))
    except errors.InsufficientPrivilege as e:
        raise SourceConfigurationError(
            f"not allowed to lock rows of {schema}.{table} ({e.diag.message_primary}); an "
            "incremental snapshot needs UPDATE privilege on the table (it share-locks each "
            "chunk's rows). Grant it to the capture role, or run as the table's owner") from e
    return table_shape(src, relid)


def _range(shape: TableShape, lo: Key | None, hi: Key | None) -> tuple[sql.Composable,
                                                                       list[str]]:
    conditions: list[sql.Composable] = []
    params: list[str] = []
    for op, key in ((">", lo), ("<=", hi)):
        if key is not None:
            conditions.append(sql.SQL("{} {} {}").format(shape.order_tuple(), sql.SQL(op),
                                                          shape.placeholders()))
            params.extend(key)
    if not conditions:
        return sql.SQL(""), params
    return sql.SQL("WHERE ") + sql.SQL(" AND ").join(conditions), params


def _chunk(src: psycopg.Connection[Any], shape: TableShape, config: CaptureConfig,
           snapshot_id: int, where: sql.Composable, params: list[str],
           wanted: set[Key] | None) -> tuple[int, set[Key]]:
    """Lock and send the rows matching ``where`` (only keys in ``wanted``, when given);
    returns (rows sent, keys of rows that were locked by others and must be retried). Runs
    inside the caller's transaction."""
    positions = shape.order_positions
    locked: set[Key] = set()
    payload: list[bytes] = []
    size = 0
    sent = 0
    query = sql.SQL("SELECT {} FROM {} {} ORDER BY {} FOR SHARE SKIP LOCKED").format(
        shape.text_columns(), shape.ident, where, shape.order_by())
    with src.cursor(name="lakefold_snapshot_chunk") as cur:
        cur.execute(query, params)
        while rows := cur.fetchmany(_FETCH):
            for row in rows:
                key = tuple(row[i] for i in positions)
                locked.add(key)
                if wanted is not None and key not in wanted:
                    continue
                encoded = encode_tuple(row)
                payload.append(encoded)
                size += len(encoded)
                if size >= config.snapshot.chunk_bytes:
                    sent += _emit(src, shape, config, snapshot_id, payload)
                    payload, size = [], 0
    if payload:
        sent += _emit(src, shape, config, snapshot_id, payload)
    present = {tuple(r) for r in src.execute(
        sql.SQL("SELECT {} FROM {} {}").format(shape.order_key_text(), shape.ident, where),
        params).fetchall()}
    skipped = present - locked
    if wanted is not None:
        skipped &= wanted
    return sent, skipped


def _emit(src: psycopg.Connection[Any], shape: TableShape, config: CaptureConfig,
          snapshot_id: int, rows: list[bytes]) -> int:
    header = ChunkHeader(config.slot, snapshot_id, shape.relation(), len(rows),
                         pg_time(utc_now()))
    src.execute("SELECT pg_logical_emit_message(false, %s, %s)",
                (SNAPSHOT_PREFIX, encode_chunk(header, rows)))
    return len(rows)


def _retry(src: psycopg.Connection[Any], config: CaptureConfig, table: state.SnapshotTable,
           pending: set[Key], listener: SnapshotListener) -> int:
    """Read the rows that were locked by writers when their chunk was read."""
    policy = config.snapshot
    sent = 0
    delay = 0.02
    for _ in range(policy.lock_retries):
        if not pending:
            return sent
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
        for key in sorted(pending):
            with src.transaction():
                shape = lock_table(src, table.relid, policy.lock_timeout.total_seconds())
                where = sql.SQL("WHERE {} = {}").format(shape.order_tuple(), shape.placeholders())
                n, still = _chunk(src, shape, config, table.snapshot_id, where, list(key), {key})
            sent += n
            if not still:
                pending.discard(key)
        listener.rows_copied(table.qualified, 0)
    for key in sorted(pending):  # last resort: wait for each row's lock (holding nothing else)
        try:
            with src.transaction():
                shape = lock_table(src, table.relid, policy.lock_timeout.total_seconds())
                sent += send_row(src, shape, config, table.snapshot_id, key)
        except errors.LockNotAvailable as e:
            raise CaptureTerminalError(
                f"row {key} of {table.qualified} stayed locked by another transaction for "
                f"longer than {policy.lock_timeout}; finish or end that transaction, then run "
                "the re-snapshot again (it resumes where it stopped)") from e
    return sent


def send_row(src: psycopg.Connection[Any], shape: TableShape, config: CaptureConfig,
             snapshot_id: int, key: Key) -> int:
    """Read the row with order key ``key`` (text values) FOR SHARE, waiting for writers, and
    write it into the WAL as an in-band chunk; returns 1, or 0 when the row does not exist.
    Runs inside the caller's transaction, after ``lock_table``."""
    query = sql.SQL("SELECT {} FROM {} WHERE {} = {} FOR SHARE").format(
        shape.text_columns(), shape.ident, shape.order_tuple(), shape.placeholders())
    rows = src.execute(query, list(key)).fetchall()
    if not rows:
        return 0
    return _emit(src, shape, config, snapshot_id, [encode_tuple(r) for r in rows])
