"""Incremental re-snapshot of a table while the capture keeps streaming and writers keep
updating and deleting the same keys: the stream stays consistent with the table."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from lakefold.capture import Capture, CaptureConfig, CaptureError, ChangelogStore, SnapshotPolicy
from lakefold.capture.snapshots._incremental_snapshot import resnapshot, resume
from tests.capture.conftest import capture_now, execute, replayed_rows, source_rows
from tests.capture.snapshot_helpers import (
    Writer,
    assert_valid_histories,
    key_histories,
    seed_table,
)
from tests.fixtures.postgres import TestDatabase

pytestmark = pytest.mark.timeout(180)


def _config(dsn: str, **kw: object) -> CaptureConfig:
    return CaptureConfig(source_dsn=dsn, tables=("items",), slot="incr",
                         snapshot=SnapshotPolicy(initial=False, incremental_chunk_rows=250),
                         **kw)  # type: ignore[arg-type]


def test_resnapshot_concurrent_with_updates_and_deletes_of_the_same_keys(
        pg: TestDatabase) -> None:
    seed_table(pg.dsn, "items", 20_000)
    config = _config(pg.dsn)
    Capture(config).setup()
    writers = [Writer(pg.dsn, "items", start_id=20_001 + i * 1_000_000, seed=i, pause=0.002)
               for i in range(2)]
    stop = threading.Event()
    capture = threading.Thread(target=lambda: Capture(config).run(stop=stop), daemon=True)
    capture.start()
    for writer in writers:
        writer.start()
    try:
        time.sleep(0.3)
        before = sum(w.transactions for w in writers)
        stats = resnapshot(config, ["public.items"])
        assert sum(w.transactions for w in writers) > before  # the writers never stopped
    finally:
        for writer in writers:
            writer.stop()
        stop.set()
        capture.join(30)
    capture_now(config)
    assert stats.rows >= 19_000 and stats.chunks >= 76

    with ChangelogStore(pg.dsn) as store:
        histories = key_histories(store, "public.items")
        assert_valid_histories(histories, existed_before=True)
        source = source_rows(pg.dsn, "public.items")
        # every row that existed throughout was read exactly once by the re-snapshot
        untouched = [k for k in range(1, 20_001) if histories.get(k) == ["read"]]
        assert len(untouched) > 10_000
        assert all(k in source for k in untouched)
        assert max(ops.count("read") for ops in histories.values()) == 1
        assert replayed_rows(store, "public.items") == source


def test_rows_locked_by_a_writer_are_read_after_the_lock_is_released(pg: TestDatabase) -> None:
    seed_table(pg.dsn, "items", 1_000)
    config = _config(pg.dsn)
    Capture(config).setup()
    with psycopg.connect(pg.dsn) as holder:
        holder.execute("UPDATE items SET v = 42 WHERE id IN (10, 600)")  # locks both rows
        releaser = threading.Timer(0.6, holder.commit)
        releaser.start()
        stats = resnapshot(config, ["items"])
        releaser.join()
    assert stats.rows == 1_000
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        histories = key_histories(store, "public.items")
        # the update committed before the retried read, so it comes first in the stream
        assert histories[10] == ["update", "read"] and histories[600] == ["update", "read"]
        rows = replayed_rows(store, "public.items")
        assert rows[10]["v"] == 42 and rows == source_rows(pg.dsn, "public.items")


def test_resnapshot_while_the_capture_is_down_is_applied_when_it_runs(pg: TestDatabase) -> None:
    seed_table(pg.dsn, "items", 500)
    config = _config(pg.dsn)
    Capture(config).setup()
    execute(pg.dsn, "DELETE FROM items WHERE id <= 100")
    resnapshot(config, ["items"])  # the capture is not running: the chunks wait in the WAL
    execute(pg.dsn, "UPDATE items SET v = 7 WHERE id = 200")
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        ops = store.read("public.items", 1, 10_000).column("_op").to_pylist()
        assert ops == ["delete"] * 100 + ["read"] * 400 + ["update"]
        assert replayed_rows(store, "public.items") == source_rows(pg.dsn, "public.items")
        events = store.read_events("public.items", 101, 1)
        assert events[0].operation == "read" and events[0].xid == 0
        assert events[0].commit_lsn > 0 and events[0].ordinal == 1


def test_resnapshot_refuses_tables_the_capture_does_not_cover(pg: TestDatabase) -> None:
    seed_table(pg.dsn, "items", 10)
    execute(pg.dsn, "CREATE TABLE other (id int PRIMARY KEY)")
    config = _config(pg.dsn)
    with pytest.raises(CaptureError, match="start the capture first"):
        resnapshot(config, ["items"])
    Capture(config).setup()
    with pytest.raises(CaptureError, match="not captured"):
        resnapshot(config, ["other"])
    with pytest.raises(CaptureError, match="does not exist"):
        resnapshot(config, ["public.nope"])
    with pytest.raises(CaptureError, match="at least one table"):
        resnapshot(config, [])
    with psycopg.connect(pg.dsn) as conn:  # nothing half-made by the refusals
        assert conn.execute("SELECT count(*) FROM lakefold.capture_snapshots").fetchone() == (0,)


@pytest.mark.timeout(180)
def test_a_killed_resnapshot_is_finished_by_the_running_capture(pg: TestDatabase) -> None:
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    seed_table(pg.dsn, "items", 12_000)
    config = _config(pg.dsn)
    Capture(config).setup()
    cli = Path(sys.executable).parent / "lakefold"
    victim = subprocess.Popen([cli, "capture", "resnapshot", "items", "--dsn", pg.dsn,
                               "--slot", "incr", "--chunk-rows", "200", "--json"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def chunks() -> int:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            if conn.execute("SELECT to_regclass('lakefold.capture_snapshot_tables')"
                            ).fetchone() == (None,):
                return 0
            row = conn.execute("SELECT coalesce(sum(chunks), 0) FROM "
                               "lakefold.capture_snapshot_tables").fetchone()
        return int(row[0]) if row else 0

    deadline = time.monotonic() + 60
    while chunks() < 10:
        assert victim.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    done_before = chunks()
    assert done_before < 60  # killed in the middle

    stop = threading.Event()
    capture = threading.Thread(target=lambda: Capture(config).run(stop=stop), daemon=True)
    capture.start()  # its side thread finishes the unfinished re-snapshot
    try:
        deadline = time.monotonic() + 90
        while True:
            with psycopg.connect(pg.dsn) as conn:
                status = conn.execute("SELECT status FROM lakefold.capture_snapshots"
                                      ).fetchone()
            if status == ("done",):
                break
            assert time.monotonic() < deadline, status
            time.sleep(0.1)
    finally:
        stop.set()
        capture.join(60)
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        histories = key_histories(store, "public.items")
        assert all(ops.count("read") >= 1 for ops in histories.values())
        twice = [k for k, ops in histories.items() if ops.count("read") > 1]
        assert len(twice) <= 200  # at most the chunk interrupted by the kill
        assert replayed_rows(store, "public.items") == source_rows(pg.dsn, "public.items")


def test_resnapshot_claims_its_run_before_a_running_capture_can(pg: TestDatabase) -> None:
    """A running capture finishes incremental runs whose process died (``resume``); a run
    that ``resnapshot`` has just recorded is never one of them, however eagerly the capture
    looks (here: without pause, beside twenty re-snapshots)."""
    seed_table(pg.dsn, "items", 50)
    config = _config(pg.dsn)
    Capture(config).setup()
    stop = threading.Event()
    finished_by_the_capture: list[int] = []

    def finisher() -> None:
        while not stop.is_set():
            finished_by_the_capture.extend(s.snapshot_id for s in resume(
                config, kinds=("incremental",)))

    thread = threading.Thread(target=finisher, daemon=True)
    thread.start()
    try:
        for _ in range(20):
            stats = resnapshot(config, ["public.items"])
            assert stats.rows == 50
    finally:
        stop.set()
        thread.join(timeout=30)
    assert finished_by_the_capture == []
