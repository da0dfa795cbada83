"""Slot health from Python; an invalidated slot (small max_slot_wal_keep_size) gives a clear
error naming the slot and the cause, and ``recover`` brings the capture back with a truncate
record and a fresh snapshot; pause and resume keep the slot's place."""

from __future__ import annotations

import os
import socket
import threading
import time
from datetime import timedelta

import psycopg
import pytest

from lakefold.capture import (
    Capture,
    CaptureConfig,
    ChangelogStore,
    HealthThresholds,
    HeartbeatPolicy,
    SlotInvalidatedError,
    pause_capture,
    recover,
    resume_capture,
    slot_health,
)
from lakefold.local import LocalPostgres
from tests.capture.conftest import capture_now, execute, replayed_rows, source_rows
from tests.fixtures.postgres import TestDatabase


def _wait(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.timeout(120)
def test_health_of_a_running_and_a_stopped_capture(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY, v int)",
            "INSERT INTO t SELECT g, g FROM generate_series(1, 100) g")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot="health",
                           heartbeat=HeartbeatPolicy(interval=timedelta(seconds=0.2)))
    missing = slot_health(config)
    assert missing.status == "missing" and not missing.exists
    capture_now(config)
    stopped = slot_health(config)
    assert stopped.exists and not stopped.active and stopped.status == "warning"
    assert "no capture is streaming from the slot" in stopped.problems
    assert stopped.running_capture is None
    assert stopped.wal_status == "reserved" and stopped.records == 100
    assert stopped.confirmed_lsn is not None and stopped.lag_bytes is not None
    assert stopped.as_dict()["confirmed_lsn_text"].count("/") == 1

    stop = threading.Event()
    runner = threading.Thread(target=lambda: Capture(config).run(stop=stop), daemon=True)
    runner.start()
    try:
        _wait(lambda: slot_health(config).active)
        owner = slot_health(config).running_capture  # who runs it, for the operator
        assert owner is not None and f"host {socket.gethostname()}, pid {os.getpid()}, " \
            "since " in owner, owner
        execute(pg.dsn, "UPDATE t SET v = v + 1")
        _wait(lambda: slot_health(config).last_heartbeat_at is not None)
        running = slot_health(config)
        assert running.status == "ok", running.problems
        assert running.lag_seconds is not None and running.lag_seconds < 30
        strict = slot_health(config, thresholds=HealthThresholds(lag_bytes=(0, 1 << 40)))
        assert strict.status == "warning" and "lag of" in strict.problems[0]
    finally:
        stop.set()
        runner.join(30)


@pytest.mark.timeout(120)
def test_pause_keeps_the_slot_in_place_until_resume(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY, v int)")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot="pausing")
    Capture(config).setup()
    stop = threading.Event()
    runner = threading.Thread(target=lambda: Capture(config).run(stop=stop), daemon=True)
    runner.start()
    try:
        _wait(lambda: slot_health(config).active)
        execute(pg.dsn, "INSERT INTO t VALUES (1, 1)")
        with ChangelogStore(pg.dsn) as store:
            _wait(lambda: store.head("public.t") == 1)
            pause_capture(pg.dsn, "pausing")
            _wait(lambda: not slot_health(config).active)
            paused = slot_health(config)
            assert paused.paused and "paused" in " ".join(paused.problems)
            execute(pg.dsn, "INSERT INTO t VALUES (2, 2)")
            time.sleep(1.0)
            assert store.head("public.t") == 1  # nothing captured while paused
            assert slot_health(config).confirmed_lsn == paused.confirmed_lsn
            resume_capture(pg.dsn, "pausing")
            _wait(lambda: store.head("public.t") == 2)
            assert not slot_health(config).paused
    finally:
        stop.set()
        runner.join(30)


@pytest.mark.timeout(180)
def test_invalidated_slot_clear_error_and_recovery() -> None:
    with LocalPostgres(durable=False, settings={"max_slot_wal_keep_size": "1MB",
                                                "wal_keep_size": "0"}) as server:
        server.start()
        dsn = server.dsn()
        execute(dsn, "CREATE TABLE t (id int PRIMARY KEY, v int)",
                "CREATE TABLE noise (id bigserial PRIMARY KEY, pad text)",
                "INSERT INTO t SELECT g, g FROM generate_series(1, 50) g")
        config = CaptureConfig(source_dsn=dsn, tables=("t",), slot="fragile")
        capture_now(config)
        execute(dsn, "DELETE FROM t WHERE id <= 10")  # lost with the WAL: recovery must
        execute(dsn, "UPDATE t SET v = -1 WHERE id = 20")  # still end up equal to the table
        with psycopg.connect(dsn, autocommit=True) as conn:
            for _ in range(4):  # ~64 MB of WAL while the capture is down, then checkpoints
                conn.execute("INSERT INTO noise (pad) SELECT repeat('x', 1000) "
                             "FROM generate_series(1, 15000)")
                conn.execute("SELECT pg_switch_wal()")
                conn.execute("CHECKPOINT")
        health = slot_health(config)
        assert health.status == "lost" and health.wal_status == "lost"
        assert health.invalidation_reason == "wal_removed"
        assert "lakefold capture recover --slot fragile" in health.problems[0]
        with pytest.raises(SlotInvalidatedError) as failure:
            capture_now(config)
        message = str(failure.value)
        assert "'fragile'" in message and "max_slot_wal_keep_size" in message
        assert "lakefold capture recover --slot fragile" in message

        recover(config)  # the one command: new slot, truncate record, fresh snapshot
        execute(dsn, "INSERT INTO t VALUES (1000, 1)")
        capture_now(config)
        with ChangelogStore(dsn) as store:
            ops = store.read("public.t", 1, 1000).column("_op").to_pylist()
            assert ops == ["read"] * 50 + ["truncate"] + ["read"] * 40 + ["insert"]
            assert replayed_rows(store, "public.t") == source_rows(dsn, "public.t")
        after = slot_health(config)
        assert after.exists and after.wal_status == "reserved"
        # with max_slot_wal_keep_size = 1MB the headroom stays tiny: that is critical
        assert after.status == "critical" and "safe_wal_size" in after.problems[0]


@pytest.mark.timeout(120)
def test_health_on_a_server_older_than_postgresql_17(pg: TestDatabase) -> None:
    """pg_replication_slots gained invalidation_reason and inactive_since in PostgreSQL 17;
    status must work on the PostgreSQL 15 and 16 servers users run. The test server's catalog
    view is shadowed by one without those columns (pg_catalog placed after it in the
    search_path), as an older server has it."""
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)",
            "CREATE SCHEMA pg15",
            "CREATE VIEW pg15.pg_replication_slots AS SELECT slot_name, plugin, slot_type, "
            "datoid, database, temporary, active, active_pid, xmin, catalog_xmin, "
            "restart_lsn, confirmed_flush_lsn, wal_status, safe_wal_size, two_phase "
            "FROM pg_catalog.pg_replication_slots")
    params = psycopg.conninfo.conninfo_to_dict(pg.dsn)
    params["options"] = "-c search_path=pg15,pg_catalog,public"
    older = psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]
    with psycopg.connect(older) as conn:  # the shadow works: the new column is unknown
        with pytest.raises(psycopg.errors.UndefinedColumn):
            conn.execute("SELECT invalidation_reason FROM pg_replication_slots")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot="older")
    capture_now(config)
    health = slot_health(CaptureConfig(source_dsn=older, store_dsn=pg.dsn, tables=("t",),
                                       slot="older"))
    assert health.exists and health.wal_status == "reserved"
    assert health.invalidation_reason is None and health.inactive_since is None
