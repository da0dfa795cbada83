"""Slot ownership: one live capture per slot and store, a clean take-over, no hand-over
ping-pong, a stalled former owner that never writes again, and a slot creation that a SIGKILL
at any point cannot make unrecoverable."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from lakefold.capture import Capture, CaptureConfig, ChangelogStore
from lakefold.capture.exceptions import (
    CaptureRunningError,
    OwnershipLostError,
    UnknownStreamError,
)
from lakefold.capture.operations._capture import drop_capture
from lakefold.store._changelog_writer import Batch, ChangelogWriter, Checkpoint
from tests.capture import creation_victim
from tests.capture.conftest import capture_now, execute, replayed_rows, source_rows
from tests.fixtures.postgres import TestDatabase

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).parent / "lakefold"
HOST = socket.gethostname()


# -- helpers -------------------------------------------------------------------------------

def _cli_args(dsn: str, slot: str, *extra: str) -> list[str]:
    return [str(CLI), "capture", "run", "--dsn", dsn, "--table", "public.t", "--slot", slot,
            "--publication", slot, *extra]


@contextmanager
def _cli_capture(dsn: str, slot: str, log: Path, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    """``lakefold capture run`` as a process (its output in ``log``); ended at exit."""
    with log.open("wb") as out:
        process = subprocess.Popen(_cli_args(dsn, slot, *extra), cwd=ROOT, stdout=out,
                                   stderr=subprocess.STDOUT)
        try:
            yield process
        finally:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.kill()
            process.wait()


def _output(log: Path) -> str:
    return " ".join(log.read_text(errors="replace").split())


def _active_pid(dsn: str, slot: str) -> int | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                           (slot,)).fetchone()
    return None if row is None else row[0]


def _wait(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _wait_streaming(dsn: str, slot: str, *, other_than: int | None = None) -> int:
    """The pid of the walsender streaming ``slot`` once a capture streams (not ``other_than``;
    the connection that creates the slot holds it during the initial snapshot: not that one,
    the capture's store sessions only exist once it streams)."""
    found: list[int] = []

    def streaming() -> bool:
        pid = _active_pid(dsn, slot)
        if pid is None or pid == other_than or len(_store_sessions(dsn, slot)) < 2:
            return False
        found.append(pid)
        return True

    _wait(streaming, f"a walsender on slot {slot}")
    return found[-1]


def _walsenders_over(dsn: str, slot: str, seconds: float) -> set[int | None]:
    """Every pid seen holding ``slot`` during ``seconds`` (a hand-over shows as two)."""
    seen: set[int | None] = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen.add(_active_pid(dsn, slot))
        time.sleep(0.02)
    return seen


def _store_sessions(dsn: str, slot: str) -> set[tuple[int, object]]:
    """Store sessions (pid, start) that read or write the slot's records (any capture's)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT pid, backend_start FROM pg_stat_activity "
                            "WHERE application_name = %s", (f"lakefold-store:{slot}",)).fetchall()
    return {(r[0], r[1]) for r in rows}


def _wait_equal_to_source(dsn: str, stream: str, timeout: float = 90.0) -> None:
    def equal() -> bool:
        with ChangelogStore(dsn) as store:
            try:
                return replayed_rows(store, stream) == source_rows(dsn, "t")
            except UnknownStreamError:
                return False

    _wait(equal, f"{stream} to equal the source table", timeout)


def _assert_no_duplicates(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        twice = conn.execute(
            "SELECT commit_lsn, ordinal, count(*) FROM lakefold.changelog WHERE op <> 'r' "
            "GROUP BY 1, 2 HAVING count(*) > 1").fetchall()
        gaps = conn.execute(
            "SELECT s.name FROM lakefold.changelog_streams s WHERE s.head <> "
            "(SELECT count(*) FROM lakefold.changelog c WHERE c.stream_id = s.stream_id) + "
            "(SELECT coalesce(sum(last_position - first_position + 1), 0) "
            " FROM lakefold.changelog_segments g WHERE g.stream_id = s.stream_id)").fetchall()
    assert not twice, f"records stored twice: {twice[:5]}"
    assert not gaps, f"streams whose positions are not dense: {gaps}"


class _Writes:
    """Small source transactions on ``t`` in a thread, until stopped."""

    def __init__(self, dsn: str, seed: int) -> None:
        self._dsn = dsn
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.transactions = 0

    def __enter__(self) -> _Writes:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        with psycopg.connect(self._dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                key = self._rng.randrange(1, 2_000)
                with conn.transaction():
                    conn.execute("INSERT INTO t VALUES (%s, 0) ON CONFLICT (id) DO UPDATE "
                                 "SET v = t.v + 1", (key,))
                    if self._rng.random() < 0.2:
                        conn.execute("DELETE FROM t WHERE id = %s",
                                     (self._rng.randrange(1, 2_000),))
                self.transactions += 1
                time.sleep(0.002)


def _table(dsn: str, rows: int = 500) -> None:
    execute(dsn, "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)")
    execute(dsn, "INSERT INTO t SELECT g, 0 FROM generate_series(1, %s) g", params=(rows,))


# -- one live capture per slot -------------------------------------------------------------

@pytest.mark.timeout(180)
def test_a_second_capture_refuses_naming_the_running_one(pg: TestDatabase,
                                                        tmp_path: Path) -> None:
    _table(pg.dsn)
    with _cli_capture(pg.dsn, "owned", tmp_path / "first.log") as first:
        walsender = _wait_streaming(pg.dsn, "owned")
        _wait_equal_to_source(pg.dsn, "public.t")
        second = subprocess.run(_cli_args(pg.dsn, "owned"), cwd=ROOT, capture_output=True,
                                text=True, timeout=30, check=False)
        assert second.returncode == 1, second.stdout + second.stderr
        message = " ".join(second.stderr.split())
        assert "'owned' is being captured by another lakefold capture" in message, message
        assert f"host {HOST}, pid {first.pid}, since 20" in message, message
        assert "--take-over" in message, message
        with pytest.raises(CaptureRunningError, match=r"'owned' is being captured.*"
                                                      r"Stop that capture first, then drop"):
            drop_capture(pg.dsn, pg.dsn, slot="owned", publication="owned")
        # no hand-over: the first capture keeps the slot through the same walsender
        assert _walsenders_over(pg.dsn, "owned", 2.0) == {walsender}
        execute(pg.dsn, "UPDATE t SET v = 1 WHERE id <= 100", "DELETE FROM t WHERE id > 450")
        _wait_equal_to_source(pg.dsn, "public.t")
        assert first.poll() is None
        first.send_signal(signal.SIGTERM)
        assert first.wait(60) == 0, _output(tmp_path / "first.log")
    _assert_no_duplicates(pg.dsn)


@pytest.mark.timeout(240)
def test_take_over_stops_the_running_capture_cleanly_without_ping_pong(
        pg: TestDatabase, tmp_path: Path) -> None:
    _table(pg.dsn)
    with _Writes(pg.dsn, seed=1) as writes, \
            _cli_capture(pg.dsn, "handed", tmp_path / "first.log") as first:
        old = _wait_streaming(pg.dsn, "handed")
        time.sleep(0.5)
        with _cli_capture(pg.dsn, "handed", tmp_path / "second.log", "--take-over") as second:
            assert first.wait(60) == 1  # it exits on its own, with a message
            said = _output(tmp_path / "first.log")
            assert "Traceback" not in said, said
            assert "slot 'handed' was taken over by the capture on " \
                   f"host {HOST}, pid {second.pid}" in said, said
            assert "stored and confirmed what it had received" in said, said
            new = _wait_streaming(pg.dsn, "handed", other_than=old)
            assert _walsenders_over(pg.dsn, "handed", 3.0) == {new}  # no hand-over after
            assert second.poll() is None
            again = subprocess.run(_cli_args(pg.dsn, "handed"), cwd=ROOT, capture_output=True,
                                   text=True, timeout=30, check=False)
            assert again.returncode == 1 and f"pid {second.pid}" in again.stderr
            assert _active_pid(pg.dsn, "handed") == new
            assert writes.transactions > 0
            writes.__exit__()
            _wait_equal_to_source(pg.dsn, "public.t")
            second.send_signal(signal.SIGTERM)
            assert second.wait(60) == 0, _output(tmp_path / "second.log")
    _assert_no_duplicates(pg.dsn)


@pytest.mark.timeout(240)
def test_a_stalled_owner_that_lost_its_lock_never_captures_again(
        pg: TestDatabase, tmp_path: Path) -> None:
    _table(pg.dsn)
    config = CaptureConfig(source_dsn=pg.dsn, tables=("public.t",), slot="fenced",
                           publication="fenced")
    stop = threading.Event()
    failures: list[BaseException] = []

    def run_second() -> None:
        try:
            Capture(config).run(stop=stop)
        except BaseException as e:  # reported below
            failures.append(e)

    second = threading.Thread(target=run_second, daemon=True)
    with _Writes(pg.dsn, seed=2) as writes, \
            _cli_capture(pg.dsn, "fenced", tmp_path / "first.log") as first:
        old = _wait_streaming(pg.dsn, "fenced")
        time.sleep(0.5)
        os.kill(first.pid, signal.SIGSTOP)  # stalled with its sessions open
        stalled = _store_sessions(pg.dsn, "fenced")
        assert stalled  # the sessions that write its records
        with psycopg.connect(pg.dsn, autocommit=True) as conn:  # its lock session dies
            ended = conn.execute(
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                "WHERE application_name = 'lakefold-owner:fenced'").fetchall()
        assert ended == [(True,)]
        second.start()  # the slot is free: the second capture takes it
        try:
            new = _wait_streaming(pg.dsn, "fenced", other_than=old)
            # fencing: the new owner ended them before reading the slot's state
            assert not stalled & _store_sessions(pg.dsn, "fenced")
            time.sleep(1.0)
            os.kill(first.pid, signal.SIGCONT)
            assert first.wait(60) == 1
            said = _output(tmp_path / "first.log")
            assert "lost slot 'fenced'" in said and "Traceback" not in said, said
            assert _walsenders_over(pg.dsn, "fenced", 2.0) == {new}
            writes.__exit__()
            _wait_equal_to_source(pg.dsn, "public.t")
        finally:
            stop.set()
            second.join(60)
    assert not failures, failures
    _assert_no_duplicates(pg.dsn)


@pytest.mark.timeout(120)
def test_take_over_of_a_stuck_capture_gives_up_and_withdraws(pg: TestDatabase,
                                                             tmp_path: Path) -> None:
    _table(pg.dsn)
    config = CaptureConfig(source_dsn=pg.dsn, tables=("public.t",), slot="stuck",
                           publication="stuck", take_over=True,
                           take_over_timeout=timedelta(seconds=2))
    with _cli_capture(pg.dsn, "stuck", tmp_path / "first.log") as first:
        walsender = _wait_streaming(pg.dsn, "stuck")
        os.kill(first.pid, signal.SIGSTOP)
        try:
            with pytest.raises(CaptureRunningError,
                               match=rf"pid {first.pid}, since .*did not stop within 2 s.*"
                                     "Stop that process"):
                Capture(config).run(until_lsn=0)
        finally:
            os.kill(first.pid, signal.SIGCONT)
        time.sleep(1.0)  # the withdrawn request does not stop it later
        assert first.poll() is None
        assert _active_pid(pg.dsn, "stuck") == walsender
        execute(pg.dsn, "DELETE FROM t WHERE id <= 10")
        _wait_equal_to_source(pg.dsn, "public.t")


@pytest.mark.timeout(120)
def test_a_killed_owner_does_not_block_the_next_start(pg: TestDatabase,
                                                      tmp_path: Path) -> None:
    _table(pg.dsn)
    config = CaptureConfig(source_dsn=pg.dsn, tables=("public.t",), slot="killed",
                           publication="killed")
    with _cli_capture(pg.dsn, "killed", tmp_path / "first.log") as first:
        _wait_streaming(pg.dsn, "killed")
        first.kill()
        first.wait()
    execute(pg.dsn, "UPDATE t SET v = 2 WHERE id % 3 = 0")
    started = time.monotonic()
    capture_now(config)  # its walsender may linger: it is ended, the slot taken over
    assert time.monotonic() - started < 20
    with ChangelogStore(pg.dsn) as store:
        assert replayed_rows(store, "public.t") == source_rows(pg.dsn, "t")


def test_a_batch_of_a_former_owner_is_refused(pg: TestDatabase) -> None:
    _table(pg.dsn, rows=10)
    config = CaptureConfig(source_dsn=pg.dsn, tables=("public.t",), slot="fence",
                           publication="fence")
    capture_now(config)
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        before = conn.execute("SELECT flush_lsn FROM lakefold.capture_slots").fetchone()
        writer = ChangelogWriter(conn, "fence", owner="a former owner")
        with pytest.raises(OwnershipLostError, match=r"'fence'.*another capture owns it"):
            writer.write_batch(Batch(checkpoint=Checkpoint(1 << 40, 1, True, 1 << 40)))
        assert conn.execute("SELECT flush_lsn FROM lakefold.capture_slots").fetchone() == before


# -- slot creation survives a SIGKILL at any point ------------------------------------------

def _some_changes(dsn: str, rng: random.Random) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(30):
            key = rng.randrange(1, 800)
            conn.execute("INSERT INTO t VALUES (%s, 0) ON CONFLICT (id) DO UPDATE "
                         "SET v = t.v + 1", (key,))
            if rng.random() < 0.3:
                conn.execute("DELETE FROM t WHERE id = %s", (rng.randrange(1, 800),))


def _slot_exists(dsn: str, slot: str) -> bool:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s",
                            (slot,)).fetchone() is not None


def _registered(dsn: str, slot: str) -> bool:
    with psycopg.connect(dsn) as conn:
        if conn.execute("SELECT to_regclass('lakefold.capture_slots')").fetchone() == (None,):
            return False
        return conn.execute("SELECT 1 FROM lakefold.capture_slots WHERE slot_name = %s",
                            (slot,)).fetchone() is not None


@pytest.mark.slow
@pytest.mark.timeout(280)
@pytest.mark.parametrize("point", creation_victim.POINTS)
def test_sigkill_at_slot_creation_then_the_next_start_recovers(pg: TestDatabase,
                                                               point: str) -> None:
    _table(pg.dsn)
    rng = random.Random(point)
    slot = "birth"
    kills = 1 if point == "before-copy" else 3  # a registered slot is not created again
    for _ in range(kills):
        _some_changes(pg.dsn, rng)
        victim = subprocess.run(
            [sys.executable, "-m", "tests.capture.creation_victim", pg.dsn, slot, point],
            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
        assert victim.returncode == -signal.SIGKILL, victim.stderr
        # the kill hit its point
        assert _slot_exists(pg.dsn, slot) == (point != "before-create")
        assert _registered(pg.dsn, slot) == (point == "before-copy")
    _some_changes(pg.dsn, rng)
    config = creation_victim.config(pg.dsn, slot)
    capture_now(config)  # the next start succeeds
    _some_changes(pg.dsn, rng)
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        assert replayed_rows(store, f"{slot}:public.t") == source_rows(pg.dsn, "t")
    with psycopg.connect(pg.dsn) as conn:
        slots = conn.execute("SELECT slot_name, active FROM pg_replication_slots").fetchall()
        runs = conn.execute("SELECT kind, status FROM lakefold.capture_snapshots "
                            "WHERE status <> 'abandoned'").fetchall()
    assert slots == [(slot, False)]  # nothing orphaned, nothing left holding WAL
    assert runs == [("initial", "done")]
    _assert_no_duplicates(pg.dsn)
