"""Crash safety: the capture process is SIGKILLed at random moments, again and again, during a
mixed workload that includes one 200k-row single-transaction COPY; afterwards nothing is lost
and nothing is duplicated. Also: a server restart in the middle of capturing."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from lakefold.capture import Capture, CaptureConfig, ChangelogStore
from lakefold.core.exceptions import LakefoldError
from lakefold.local import LocalPostgres
from tests.capture.capture_victim import config as victim_config
from tests.capture.conftest import capture_now, execute, replayed_rows, source_rows
from tests.fixtures.postgres import TestDatabase

ROOT = Path(__file__).resolve().parents[2]
KILLS = 22
BIG_COPY_ROWS = 200_000


def mixed_workload(dsn: str, stop: threading.Event, big_copy_after: threading.Event,
                   copied: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    next_id = 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            if big_copy_after.is_set():
                big_copy_after.clear()
                with conn.transaction(), conn.cursor() as cur, cur.copy(
                        "COPY a (id, v, pad) FROM STDIN") as copy:
                    for i in range(BIG_COPY_ROWS):
                        copy.write_row((10_000_000 + i, i, "copy"))
                copied.set()
                continue
            with conn.transaction():
                for _ in range(rng.randint(1, 20)):
                    table = rng.choice(("a", "b"))
                    action = rng.random()
                    ident = sql.Identifier(table)
                    if action < 0.5 or next_id < 50:
                        conn.execute(sql.SQL("INSERT INTO {} (id, v) VALUES (%s, %s)").format(
                            ident), (next_id, 0))
                        next_id += 1
                    elif action < 0.8:
                        conn.execute(sql.SQL("UPDATE {} SET v = v + 1 WHERE id = %s").format(
                            ident), (rng.randrange(1, next_id),))
                    elif action < 0.93:
                        conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(ident),
                                     (rng.randrange(1, next_id),))
                    else:  # a key change
                        conn.execute(sql.SQL("UPDATE {} SET id = %s WHERE id = %s").format(
                            ident), (next_id, rng.randrange(1, next_id)))
                        next_id += 1
            time.sleep(rng.random() * 0.005)


def mid_transaction_state(dsn: str) -> bool:
    """True when the store holds part of a transaction (a partial or a staged one)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT NOT complete OR EXISTS (SELECT 1 FROM lakefold.capture_staging_crash) "
            "FROM lakefold.capture_slots").fetchone()
    return bool(row and row[0])


def wait_until_mid_transaction(dsn: str, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not mid_transaction_state(dsn):
        time.sleep(0.02)


def reference_counts(dsn: str) -> Counter[int]:
    """Records per transaction id according to test_decoding (a key change counts twice)."""
    counts: Counter[int] = Counter()
    with psycopg.connect(dsn) as conn:
        for xid, data in conn.execute(
                "SELECT xid::text::bigint, data FROM pg_logical_slot_get_changes('ref', NULL, "
                "NULL, 'skip-empty-xacts', '1')"):
            if data.startswith(("table public.a:", "table public.b:")):  # not the store
                counts[xid] += 2 if ": UPDATE: old-key:" in data else 1
    return counts


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_sigkill_loop_loses_nothing_and_duplicates_nothing(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE a (id bigint PRIMARY KEY, v int, pad text)",
            "CREATE TABLE b (id bigint PRIMARY KEY, v int)",
            # big transactions are streamed (protocol v2) when the victim asks for streaming
            sql.SQL("ALTER DATABASE {} SET logical_decoding_work_mem = '1MB'").format(
                sql.Identifier(pg.name)))
    Capture(victim_config(pg.dsn, streaming=True)).setup()
    execute(pg.dsn, "SELECT pg_create_logical_replication_slot('ref', 'test_decoding')")
    stop = threading.Event()
    big_copy = threading.Event()
    copied = threading.Event()
    writer = threading.Thread(target=mixed_workload, args=(pg.dsn, stop, big_copy, copied, 3))
    writer.start()
    rng = random.Random(11)
    kills = 0
    mid_transaction = 0  # kills that left a transaction half-written (partial or staged)
    try:
        for round_ in range(KILLS):
            if round_ == 3:
                big_copy.set()
            victim = subprocess.Popen(
                [sys.executable, "-m", "tests.capture.capture_victim", pg.dsn,
                 rng.choice("01")], cwd=ROOT, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE)
            if 3 <= round_ < 9 and copied.wait(30):
                # Aim some kills at the 200k-row transaction while it is half stored.
                wait_until_mid_transaction(pg.dsn, timeout=4.0)
                time.sleep(rng.uniform(0, 0.05))
            else:
                time.sleep(rng.uniform(0.4, 2.2))
            if victim.poll() is not None:  # it must not have died on its own
                raise AssertionError(victim.stderr.read().decode() if victim.stderr else "")
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait()
            if victim.stderr:
                victim.stderr.close()
            kills += 1
            mid_transaction += mid_transaction_state(pg.dsn)
    finally:
        stop.set()
        writer.join(60)
    assert kills >= 20
    assert mid_transaction >= 1
    capture_now(victim_config(pg.dsn, streaming=False))

    with psycopg.connect(pg.dsn) as conn:
        records = conn.execute(
            "SELECT stream_id, position, commit_lsn, ordinal, xid FROM lakefold.changelog "
            "ORDER BY stream_id, position").fetchall()
        heads: dict[int, int] = dict(conn.execute(
            "SELECT stream_id, head FROM lakefold.changelog_streams").fetchall())
    dedupe = Counter((r[2], r[3]) for r in records)
    assert max(dedupe.values()) == 1, "a (commit_lsn, ordinal) was stored twice"
    for stream_id, head in heads.items():  # dense positions, all visible
        assert [r[1] for r in records if r[0] == stream_id] == list(range(1, head + 1))
    per_commit: dict[int, list[int]] = {}
    for record in records:
        per_commit.setdefault(record[2], []).append(record[3])
    for ordinals in per_commit.values():  # no record missing inside a transaction
        assert sorted(ordinals) == list(range(1, len(ordinals) + 1))
    ours = Counter(r[4] for r in records)
    assert ours == reference_counts(pg.dsn)  # no transaction missing, none extra
    assert max(ours.values()) >= BIG_COPY_ROWS
    with ChangelogStore(pg.dsn) as store:
        for table in ("a", "b"):
            assert replayed_rows(store, f"public.{table}") == source_rows(pg.dsn, table)
        store.compact()
        for table in ("a", "b"):  # the compacted changelog is the table, row for row
            compacted = store.read(f"public.{table}", 0, 1_000_000).to_pylist()
            live = {r["id"]: {k: v for k, v in r.items() if not k.startswith("_")}
                    for r in compacted if r["_op"] != "delete"}
            assert live == source_rows(pg.dsn, table)
            deleted = {r["id"] for r in compacted if r["_op"] == "delete"}
            assert not deleted & set(live)


@pytest.mark.timeout(120)
def test_server_restart_during_capture_reconnects_and_resumes(tmp_path: Path) -> None:
    with LocalPostgres(durable=False) as server:
        server.start()
        dsn = server.dsn()
        execute(dsn, "CREATE TABLE t (id int PRIMARY KEY, v int)")
        config = CaptureConfig(source_dsn=dsn, tables=("t",), slot="restart",
                               batch_rows=100)
        capture = Capture(config)
        capture.setup()
        stop = threading.Event()
        result: list[object] = []
        runner = threading.Thread(target=lambda: result.append(capture.run(stop=stop)))
        runner.start()
        try:
            execute(dsn, "INSERT INTO t SELECT g, 0 FROM generate_series(1, 2000) g")
            time.sleep(0.3)
            with psycopg.connect(dsn, autocommit=True) as conn:  # a workload that is cut
                conn.execute("UPDATE t SET v = 1 WHERE id <= 1000")
            server.restart()  # fast shutdown: every connection is cut
            execute(dsn, "UPDATE t SET v = 2 WHERE id > 1500", "DELETE FROM t WHERE id < 10")
            deadline = time.monotonic() + 60
            with ChangelogStore(dsn) as store:
                while time.monotonic() < deadline:
                    try:
                        if store.head("public.t") >= 2000 + 1000 + 500 + 9:
                            break
                    except (LakefoldError, psycopg.Error):  # the store restarts too
                        store.close()
                    time.sleep(0.1)
        finally:
            stop.set()
            runner.join(60)
        assert result, "the capture did not return after stop"
        assert result[0].reconnects >= 1  # type: ignore[attr-defined]
        with ChangelogStore(dsn) as store:
            assert store.head("public.t") == 3509
            assert replayed_rows(store, "public.t") == source_rows(dsn, "public.t")
