"""Helpers for the capture tests: run a capture until the source's current WAL position, read a
stream back as {key: row}, read the source table the same way."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from lakefold.capture import Capture, CaptureConfig, CaptureStats, ChangelogStore, parse_lsn
from lakefold.capture.exceptions import UnknownStreamError
from tests.fixtures.postgres import TestDatabase


def wal_insert_lsn(dsn: str) -> int:
    """The source's WAL insert position: every change committed so far is before it."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return parse_lsn(row[0])


def capture_now(config: CaptureConfig) -> CaptureStats:
    """Run the capture until everything committed so far is in the store."""
    return Capture(config).run(until_lsn=wal_insert_lsn(config.source_dsn))


def running_capture(config: CaptureConfig) -> tuple[threading.Event, threading.Thread,
                                                    list[BaseException]]:
    """The capture running in a thread until the event is set; its errors in the list."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            Capture(config).run(stop=stop)
        except BaseException as e:  # reported by the test
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return stop, thread, errors


def execute(dsn: str, *statements: str | sql.Composed, params: Any = None) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement, params)


def source_rows(dsn: str, table: str, key: str = "id") -> dict[Any, dict[str, Any]]:
    """The table's rows as {key: {column: value}} (values as psycopg loads them)."""
    schema, _, name = table.rpartition(".")
    with psycopg.connect(dsn) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(schema or "public", name)))
        return {row[key]: dict(row) for row in cur.fetchall()}


def replayed_rows(store: ChangelogStore, stream: str, key: str = "id") -> dict[Any, dict[str, Any]]:
    """Apply every record of the stream in position order: the table as the stream says."""
    rows: dict[Any, dict[str, Any]] = {}
    position = 1
    while True:
        events = store.read_events(stream, position, 5_000)
        if not events:
            return rows
        for event in events:
            if event.operation == "truncate":
                rows.clear()
            elif event.operation == "delete":
                assert event.key is not None
                rows.pop(event.key[key], None)
            else:
                assert event.after is not None
                rows[event.after[key]] = event.after
        position = (events[-1].position or 0) + 1


_OP_CODES = {"insert": "i", "update": "u", "delete": "d", "truncate": "t", "read": "r"}


def stream_records(dsn: str, stream: str) -> list[tuple[int, int, int, str]]:
    """(position, commit_lsn, ordinal, op code) of every visible record of ``stream`` (rows and
    snapshot segments alike), by position."""
    records: list[tuple[int, int, int, str]] = []
    with ChangelogStore(dsn) as store:
        while True:
            try:
                table = store.read(stream, len(records) and records[-1][0] + 1, 100_000)
            except UnknownStreamError:
                return []
            if not table.num_rows:
                return records
            records += [(p, lsn, o, _OP_CODES[op]) for p, lsn, o, op in zip(
                *(table.column(c).to_pylist() for c in ("_position", "_commit_lsn", "_ordinal",
                                                        "_op")), strict=True)]


def stored_records(dsn: str) -> int:
    """How many records the store holds, visible or not: changelog rows and the records of
    snapshot segments."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM lakefold.changelog) + (SELECT coalesce(sum("
            "last_position - first_position + 1), 0) FROM lakefold.changelog_segments)"
        ).fetchone()
    assert row is not None
    return int(row[0])


def _unfinished_runs(config: CaptureConfig) -> bool:
    from lakefold.store import _capture_state

    with psycopg.connect(config.resolved_store_dsn) as conn:
        return bool(_capture_state.runs(conn, config.slot, status="running"))


def capture_settled(config: CaptureConfig, *, rounds: int = 10, timeout: float = 60.0) -> None:
    """Capture until everything committed is stored and no snapshot run is unfinished: a
    table that joins the publication is re-snapshotted by a running capture's side thread
    (``capture_now`` alone ends before that thread gets to it)."""
    import threading
    import time

    for _ in range(rounds):
        capture_now(config)  # stores what is committed (and plans the runs of joins)
        if not _unfinished_runs(config):
            return
        stop = threading.Event()
        errors: list[BaseException] = []

        def run(stop: threading.Event, errors: list[BaseException]) -> None:
            try:
                Capture(config).run(stop=stop)
            except BaseException as e:  # re-raised below
                errors.append(e)

        thread = threading.Thread(target=run, args=(stop, errors), daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout
        try:
            while _unfinished_runs(config) and not errors:
                assert time.monotonic() < deadline, f"snapshot runs of {config.slot} hang"
                time.sleep(0.1)
        finally:
            stop.set()
            thread.join(timeout=60)
        assert not errors, errors
    raise AssertionError(f"snapshot runs of {config.slot} keep coming")


@pytest.fixture
def replication_role(pg: TestDatabase) -> Iterator[str]:
    """A DSN for a login role with REPLICATION that is not a superuser; it may create in the
    database and in schema public, and owns table ``t (id int PRIMARY KEY, v text)``."""
    import uuid

    from tests.fixtures.postgres import drop_database

    role = f"r_{uuid.uuid4().hex[:8]}"
    execute(pg.dsn, sql.SQL("CREATE ROLE {} LOGIN REPLICATION").format(sql.Identifier(role)),
            sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(sql.Identifier(pg.name),
                                                              sql.Identifier(role)),
            sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(role)),
            "CREATE TABLE t (id int PRIMARY KEY, v text)",
            sql.SQL("ALTER TABLE t OWNER TO {}").format(sql.Identifier(role)))
    params = psycopg.conninfo.conninfo_to_dict(pg.dsn)
    params["user"] = role
    try:
        yield psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]
    finally:  # the role owns objects in the database: drop it first
        drop_database(pg.server, pg.name)
        execute(pg.server.admin_dsn, sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
