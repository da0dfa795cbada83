"""``lakefold events``: install, status (exit 2 while the watermark is held) and tail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from lakefold.eventstore import EventStore
from lakefold.schemas import NewEvent
from tests.fixtures.postgres import TestDatabase

LAKEFOLD = str(Path(sys.executable).parent / "lakefold")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LAKEFOLD, "events", *args], capture_output=True, text=True,
                          timeout=60, env=_env())


@pytest.mark.timeout(120)
def test_install_status_and_tail(pg: TestDatabase) -> None:
    assert _run("install", "--dsn", pg.dsn).returncode == 0
    tail = subprocess.Popen(
        [LAKEFOLD, "events", "tail", "--dsn", pg.dsn, "--category", "order", "--json",
         "--limit", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        with EventStore(pg.dsn) as store:
            deadline = time.monotonic() + 30
            # the tail starts after the head: keep appending until it has printed three
            while tail.poll() is None:
                assert time.monotonic() < deadline, "tail printed nothing"
                store.append("order-1", [NewEvent("order.placed", {"n": 1})])
                store.append("invoice-1", [NewEvent("invoice.sent", {})])
                time.sleep(0.3)
        out, err = tail.communicate(timeout=30)
    finally:
        tail.kill()
    assert tail.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 3
    assert {line["stream_id"] for line in lines} == {"order-1"}
    assert [line["position"] for line in lines] == sorted(line["position"] for line in lines)
    assert lines[0]["data"] == {"n": 1} and lines[0]["type"] == "order.placed"

    plain = _run("tail", "--dsn", pg.dsn, "--from-position", "1", "--type", "invoice.sent",
                 "--idle-timeout", "0.5")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines()[0].split()[1:3] == ["invoice-1@1", "invoice.sent"]

    status = _run("status", "--dsn", pg.dsn, "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["watermark_held"] is False
    with psycopg.connect(pg.dsn) as holder:
        holder.execute("SELECT pg_current_xact_id(), 'holding it'")
        with EventStore(pg.dsn) as store:
            store.append("order-2", [NewEvent("order.placed", {"n": 2})])
        time.sleep(0.3)
        held = _run("status", "--dsn", pg.dsn, "--json", "--threshold", "0.2")
        human = _run("status", "--dsn", pg.dsn, "--threshold", "0.2")
    assert held.returncode == 2, held.stderr
    report = json.loads(held.stdout)
    assert report["watermark_held"] and report["pending_events"] == 1
    assert "holding it" in report["holder"]["query"]
    assert human.returncode == 2 and "watermark held" in human.stdout


def test_errors_are_one_line_without_passwords(pg: TestDatabase) -> None:
    missing = _run("status", "--dsn", pg.dsn)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert "lakefold events install" in missing.stderr
    no_dsn = _run("tail")
    assert no_dsn.returncode == 1 and "LAKEFOLD_STORE_DSN" in no_dsn.stderr
    bad = _run("status", "--dsn", "host=127.0.0.1 port=1 user=u password=hunter2 "
               "connect_timeout=1")
    assert bad.returncode == 1 and "hunter2" not in bad.stderr + bad.stdout
    assert "Traceback" not in bad.stderr


def test_seal_and_status_report_segments(pg: TestDatabase) -> None:
    from lakefold.eventstore import StoreOptions, StreamEvents

    with EventStore(pg.dsn, options=StoreOptions(seal_segments=False)) as store:
        store.install()
        for part in range(2):  # 140,000 events: two whole segments
            store.append_streams([StreamEvents(f"order-{k}", [
                NewEvent("order.placed", {"n": n}) for n in range(1000)])
                for k in range(part * 70, part * 70 + 70)])
        store.head()
    before = json.loads(_run("status", "--dsn", pg.dsn, "--json").stdout)
    assert (before["segments"], before["unsealed_positions"]) == (0, 140_000)
    sealed = _run("seal", "--dsn", pg.dsn, "--json")
    assert sealed.returncode == 0, sealed.stderr
    assert json.loads(sealed.stdout) == {"segments": 2, "events": 131_072, "head": 140_000,
                                         "interrupted": False}
    after = _run("status", "--dsn", pg.dsn)
    assert "sealed segments    2" in after.stdout
    assert "unsealed positions 8928" in after.stdout
    again = _run("seal", "--dsn", pg.dsn)
    assert again.returncode == 0 and "sealed 0 segments" in again.stdout
    missing = _run("seal", "--dsn", pg.dsn.replace("dbname=", "dbname=nope_"))
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
