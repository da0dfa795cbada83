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
        holder_pid = holder.info.backend_pid
        with EventStore(pg.dsn) as store:
            store.append("order-2", [NewEvent("order.placed", {"n": 2})])
        time.sleep(0.3)
        held = _run("status", "--dsn", pg.dsn, "--json", "--threshold", "0.2")
        human = _run("status", "--dsn", pg.dsn, "--threshold", "0.2")
    assert held.returncode == 2, held.stderr
    report = json.loads(held.stdout)
    assert report["watermark_held"] and report["pending_events"] == 1
    assert report["holder"]["pid"] == holder_pid
    assert "holding it" not in held.stdout + held.stderr + human.stdout  # never the statement
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


@pytest.mark.timeout(120)
def test_append_read_and_streams_and_their_bad_input(pg: TestDatabase) -> None:
    assert _run("install", "--dsn", pg.dsn).returncode == 0
    first = _run("append", "order-7", "order.placed", "--data", '{"amount": 10}',
                 "--expected-version", "0", "--json", "--dsn", pg.dsn)
    assert first.returncode == 0, first.stderr
    appended = json.loads(first.stdout)
    assert (appended["stream_id"], appended["stream_version"]) == ("order-7", 1)
    assert appended["position"] >= 1
    assert _run("append", "order-7", "order.paid", "--data", "{}", "--expected-version", "1",
                "--dsn", pg.dsn).returncode == 0
    # bad input: one line each, exit 1, nothing written
    stale = _run("append", "order-7", "order.paid", "--data", "{}", "--expected-version", "1",
                 "--dsn", pg.dsn)
    assert stale.returncode == 1
    assert "'order-7' is at version 2, but the append expected version 1" in stale.stderr
    bad_json = _run("append", "order-7", "order.paid", "--data", "{amount: 1}",
                    "--dsn", pg.dsn)
    assert bad_json.returncode == 1 and "--data is not JSON" in bad_json.stderr
    not_object = _run("append", "order-7", "order.paid", "--data", "[1]", "--dsn", pg.dsn)
    assert not_object.returncode == 1 and "JSON object" in not_object.stderr
    unknown = _run("read", "order-8", "--dsn", pg.dsn)
    assert unknown.returncode == 1 and "'order-8' has no events" in unknown.stderr
    assert _run("read", "--dsn", pg.dsn).returncode == 1  # a stream, a category or --all
    for bad in (stale, bad_json, not_object, unknown):
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr

    read = _run("read", "order-7", "--json", "--dsn", pg.dsn)
    events = [json.loads(line) for line in read.stdout.splitlines()]
    assert [(e["stream_version"], e["type"], e["data"]) for e in events] == [
        (1, "order.placed", {"amount": 10}), (2, "order.paid", {})]
    with EventStore(pg.dsn) as store:
        assert [e.type for e in store.read_stream("order-7")] == ["order.placed", "order.paid"]
        store.append("invoice-1", [NewEvent("invoice.sent", {})])
    everything = _run("read", "--all", "--json", "--dsn", pg.dsn)
    assert [json.loads(line)["stream_id"] for line in everything.stdout.splitlines()] == [
        "order-7", "order-7", "invoice-1"]
    orders = _run("read", "--category", "order", "--from", "2", "--json", "--dsn", pg.dsn)
    assert [json.loads(line)["type"] for line in orders.stdout.splitlines()] == ["order.paid"]
    streams = json.loads(_run("streams", "--json", "--dsn", pg.dsn).stdout)
    assert [(s["stream_id"], s["category"], s["version"]) for s in streams] == [
        ("invoice-1", "invoice", 1), ("order-7", "order", 2)]
    table = _run("streams", "--category", "order", "--dsn", pg.dsn)
    assert "order-7" in table.stdout and "invoice-1" not in table.stdout

    # delete: a stale expected version and an unknown stream are refused, nothing deleted
    stale_delete = _run("delete", "order-7", "--expected-version", "1", "--dsn", pg.dsn)
    assert stale_delete.returncode == 1 and "version" in stale_delete.stderr
    unknown_delete = _run("delete", "order-9", "--dsn", pg.dsn)
    assert unknown_delete.returncode == 1 and "'order-9' has no events" in unknown_delete.stderr
    for bad in (stale_delete, unknown_delete):
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    with EventStore(pg.dsn) as store:
        assert [e.type for e in store.read_stream("order-7")] == ["order.placed", "order.paid"]
    deleted = _run("delete", "order-7", "--expected-version", "2", "--json", "--dsn", pg.dsn)
    assert deleted.returncode == 0, deleted.stderr
    assert json.loads(deleted.stdout) == {"stream_id": "order-7", "stream_version": 3,
                                          "hard": False}
    hard = _run("delete", "invoice-1", "--hard", "--dsn", pg.dsn)
    assert hard.returncode == 0 and "deleted invoice-1 (hard)" in hard.stdout
    with psycopg.connect(pg.dsn) as conn:  # soft keeps the events, hard erases them
        kept: dict[str, int] = dict(conn.execute(
            "SELECT stream_id, count(*) FILTER (WHERE type <> '$stream.deleted') "
            "FROM lakefold.events GROUP BY stream_id").fetchall())
    assert kept == {"order-7": 2, "invoice-1": 0}
