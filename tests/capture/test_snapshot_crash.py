"""SIGKILL in the middle of the initial snapshot, twice (once while copying inside the exported
snapshot, once while finishing with locked in-stream chunks), with writes running throughout:
the snapshot resumes after its last finished chunk instead of starting again, and the stream
ends up equal to the table row by row."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from lakefold.capture import ChangelogStore
from tests.capture.conftest import capture_now, replayed_rows, source_rows
from tests.capture.snapshot_helpers import (
    Writer,
    assert_valid_histories,
    key_histories,
    seed_table,
)
from tests.capture.snapshot_victim import config as victim_config
from tests.fixtures.postgres import TestDatabase

ROOT = Path(__file__).resolve().parents[2]
ROWS = 60_000


def _progress(dsn: str) -> tuple[str | None, int, list[str] | None]:
    """(run status, chunks done, last key) of the initial snapshot, as the store has them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('lakefold.capture_snapshots')").fetchone() == (None,):
            return None, 0, None
        row = conn.execute(
            "SELECT s.status, t.chunks, t.last_key FROM lakefold.capture_snapshots s "
            "JOIN lakefold.capture_snapshot_tables t USING (snapshot_id)").fetchone()
    return (None, 0, None) if row is None else (row[0], int(row[1]), row[2])


def _start(dsn: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.capture.snapshot_victim", dsn], cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _kill_when(victim: subprocess.Popen[bytes], ready: Callable[[], bool],
               timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if victim.poll() is not None:
            detail = victim.stderr.read().decode() if victim.stderr else ""
            pytest.fail(f"the capture exited early: {detail[-2000:]}")
        assert time.monotonic() < deadline, "the snapshot made no progress"
        time.sleep(0.01)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    if victim.stderr:
        victim.stderr.close()


@pytest.mark.timeout(240)
def test_sigkill_mid_snapshot_resumes_from_last_chunk(pg: TestDatabase) -> None:
    seed_table(pg.dsn, "items", ROWS)
    writer = Writer(pg.dsn, "items", start_id=ROWS + 1, seed=11, pause=0.01)
    writer.start()
    try:
        # 1. killed while copying inside the exported snapshot
        victim = _start(pg.dsn)
        _kill_when(victim, lambda: _progress(pg.dsn)[1] >= 20)
        status, chunks_1, last_1 = _progress(pg.dsn)
        assert status == "running" and last_1 is not None, "the snapshot finished before the kill"
        exported_upto = int(last_1[0])
        assert exported_upto < ROWS

        # 2. restarted: it continues after that chunk with locked chunks; killed again there
        victim = _start(pg.dsn)
        _kill_when(victim, lambda: _progress(pg.dsn)[1] >= chunks_1 + 5)
        status, _, last_2 = _progress(pg.dsn)
        assert status == "running" and last_2 is not None
        assert int(last_2[0]) > exported_upto  # resumed, not restarted

        # 3. restarted again: it finishes the snapshot and streams; killed while streaming
        victim = _start(pg.dsn)
        _kill_when(victim, lambda: _progress(pg.dsn)[0] == "done")
    finally:
        writer.stop()
    capture_now(victim_config(pg.dsn))

    with ChangelogStore(pg.dsn) as store:
        histories = key_histories(store, "public.items")
        copied_first = [k for k in range(1, exported_upto + 1) if k in histories]
        # rows copied before the first kill were read once, first, and never again
        for key in copied_first:
            assert histories[key].count("read") == 1 and histories[key][0] == "read", key
        assert_valid_histories(histories, keys=set(copied_first))
        # at most the chunk interrupted by the second kill is read twice
        twice = [k for k, ops in histories.items() if ops.count("read") > 1]
        assert len(twice) <= 300
        assert replayed_rows(store, "public.items") == source_rows(pg.dsn, "public.items")
