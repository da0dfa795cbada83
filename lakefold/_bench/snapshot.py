"""``lakefold bench snapshot``: the initial snapshot of a ``--rows`` table into the changelog,
against ``COPY (SELECT ...) TO STDOUT`` of the same table in the same run.

One throwaway PostgreSQL (fsync on) is both source and store. The table has a bigint key and
four columns (text, int, timestamptz, numeric). Measured:

- baseline: ``COPY (SELECT * FROM t) TO STDOUT`` read by a Python client (rows/s);
- results.rows_per_s: ``Capture.setup()`` of a capture of the table (slot creation with an
  exported snapshot, then the chunked copy into the changelog store as snapshot segments,
  each chunk committed with its progress), rows / seconds;
- results.incremental_rows_per_s: ``resnapshot`` of a table of ``min(--rows, 200000)`` rows
  (locked in-stream chunks written into the WAL), and the capture storing them.

The baseline and the snapshot run twice, interleaved (the slot and the store are dropped
between rounds); the best round of each is reported, every round in ``params``.
"""

from __future__ import annotations

import time
from typing import Annotated, Final

import psycopg
import typer
from psycopg import sql

from lakefold._bench import bench_app
from lakefold._bench.report import Report

_TABLE = """CREATE TABLE {} (id bigint PRIMARY KEY, name text NOT NULL, qty int NOT NULL,
    ts timestamptz NOT NULL, amount numeric(12, 2) NOT NULL)"""
_FILL = """INSERT INTO {} SELECT g, 'customer-' || g, g %% 100,
    timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second', g * 0.01
    FROM generate_series(1, %s) g"""


# Rounds of the baseline and the snapshot, interleaved; the best of each is reported (the
# machine's speed drifts between seconds, so one sample of each can land in different phases).
_ROUNDS: Final = 2


def _make_table(dsn: str, name: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(_TABLE).format(sql.Identifier(name)))
        conn.execute(sql.SQL(_FILL).format(sql.Identifier(name)), (rows,))
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(name)))


def _copy_to_stdout(dsn: str, name: str, rows: int) -> float:
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        started = time.perf_counter()
        size = 0
        with cur.copy(sql.SQL("COPY (SELECT * FROM {}) TO STDOUT").format(
                sql.Identifier(name))) as copy:
            for data in copy:
                size += len(data)
        elapsed = time.perf_counter() - started
    if size == 0:
        raise typer.BadParameter("the baseline COPY returned nothing")
    return rows / elapsed


def _snapshot(dsn: str, name: str, rows: int, chunk_rows: int) -> float:
    from lakefold.capture import Capture, CaptureConfig, ChangelogStore, SnapshotPolicy

    config = CaptureConfig(source_dsn=dsn, tables=(name,), slot=f"bench_{name}",
                           publication=f"bench_{name}", heartbeat=None,
                           snapshot=SnapshotPolicy(chunk_rows=chunk_rows))
    started = time.perf_counter()
    Capture(config).setup()
    elapsed = time.perf_counter() - started
    with ChangelogStore(dsn) as store:
        head = store.head(f"public.{name}")
    if head != rows:
        raise typer.BadParameter(f"the snapshot stored {head} records, not {rows}")
    return rows / elapsed


def _forget_snapshot(dsn: str, name: str) -> None:
    """Drop the slot and the changelog store of ``_snapshot``, for another round."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (f"bench_{name}",))
        conn.execute("DROP SCHEMA lakefold CASCADE")


def _incremental(dsn: str, rows: int) -> float:
    from lakefold.capture import (
        Capture,
        CaptureConfig,
        ChangelogStore,
        SnapshotPolicy,
        parse_lsn,
        resnapshot,
    )

    name = "incremental"
    _make_table(dsn, name, rows)
    config = CaptureConfig(source_dsn=dsn, tables=(name,), slot="bench_incr",
                           publication="bench_incr", heartbeat=None,
                           snapshot=SnapshotPolicy(initial=False))
    Capture(config).setup()
    started = time.perf_counter()
    resnapshot(config, [name])
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    Capture(config).run(until_lsn=parse_lsn(row[0] if row else "0/0"))
    elapsed = time.perf_counter() - started
    with ChangelogStore(dsn) as store:
        head = store.head(f"public.{name}")
    if head != rows:
        raise typer.BadParameter(f"the re-snapshot stored {head} records, not {rows}")
    return rows / elapsed


@bench_app.command("snapshot")
def snapshot(
    rows: Annotated[int, typer.Option(help="Rows in the snapshotted table.")] = 5_000_000,
    chunk_rows: Annotated[int, typer.Option(help="Rows per snapshot chunk.")] = 50_000,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Initial snapshot into the changelog (rows/s) against COPY TO STDOUT of the same
    table; plus an incremental re-snapshot."""
    if rows < 100 or chunk_rows < 1:
        raise typer.BadParameter("use --rows >= 100 and --chunk-rows >= 1")
    from lakefold.local import LocalPostgres

    report = Report("snapshot", {"rows": rows, "chunk_rows": chunk_rows,
                                 "store": "same server, fsync on",
                                 "incremental_rows": min(rows, 200_000)})
    with LocalPostgres(durable=True) as server:
        server.start()
        dsn = server.dsn()
        _make_table(dsn, "snap", rows)
        baselines: list[float] = []
        snapshots: list[float] = []
        for round_ in range(_ROUNDS):
            if round_:
                _forget_snapshot(dsn, "snap")
            baselines.append(_copy_to_stdout(dsn, "snap", rows))
            snapshots.append(_snapshot(dsn, "snap", rows, chunk_rows))
        incremental = _incremental(dsn, min(rows, 200_000))
    report.params["copy_to_stdout_rounds_rows_per_s"] = [round(b) for b in baselines]
    report.params["snapshot_rounds_rows_per_s"] = [round(s) for s in snapshots]
    ours, baseline = max(snapshots), max(baselines)
    report.results["rows_per_s"] = round(ours, 1)
    report.results["ratio_to_copy_to_stdout"] = round(ours / baseline, 3)
    report.results["incremental_rows_per_s"] = round(incremental, 1)
    report.baseline["copy_to_stdout_rows_per_s"] = round(baseline, 1)
    report.emit(as_json=as_json)
