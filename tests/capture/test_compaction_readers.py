"""Durable readers and compaction: compaction never passes the lowest reader position, a
reader behind what compaction removed is refused with the stream, the positions and the
compaction named, and a stream that keeps its history is not compacted.

The property test runs random workloads (inserts, updates, deletes, truncates) interleaved with
compactions and two readers that read and commit at random: a latest-state reader whose state
must equal the source table (SQL), and a history reader that must see every record after the
position it started at, in order, as the workload wrote it (the model)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import count
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from typer.testing import CliRunner

from lakefold.capture import (
    Capture,
    CaptureConfig,
    ChangelogStore,
    ReaderBehindCompactionError,
)
from lakefold.cli import app
from tests.capture.conftest import capture_now, execute, source_rows
from tests.fixtures.postgres import TestDatabase

pytestmark = pytest.mark.timeout(300)
STREAM = "public.t"
KEYS = 6


def _setup(pg: TestDatabase, slot: str = "readers") -> CaptureConfig:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot=slot, publication=slot)
    Capture(config).setup()
    return config


@dataclass
class _Model:
    """The source table as the workload left it, and every change it made, in order."""

    rows: dict[int, int] = field(default_factory=dict)
    changes: list[tuple[str, int | None, int | None]] = field(default_factory=list)
    counter: int = 0


def _write(dsn: str, model: _Model, choices: list[tuple[int, int]]) -> None:
    """One statement per choice (kind, key): insert, update or delete of one row by what the
    model holds, or a truncate; each one is one record of the stream."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for kind, key in choices:
            model.counter += 1
            if kind == 3:
                conn.execute("TRUNCATE t")
                model.rows.clear()
                model.changes.append(("truncate", None, None))
            elif key not in model.rows:
                conn.execute("INSERT INTO t VALUES (%s, %s)", (key, model.counter))
                model.rows[key] = model.counter
                model.changes.append(("insert", key, model.counter))
            elif kind == 0:
                conn.execute("DELETE FROM t WHERE id = %s", (key,))
                del model.rows[key]
                model.changes.append(("delete", key, None))
            else:
                conn.execute("UPDATE t SET v = %s WHERE id = %s", (model.counter, key))
                model.rows[key] = model.counter
                model.changes.append(("update", key, model.counter))


@dataclass
class _Reader:
    """A durable reader: it reads after its position, applies, then commits the position."""

    name: str
    history: bool
    position: int = 0
    state: dict[int, int] = field(default_factory=dict)
    seen: list[tuple[int, str, int | None, int | None]] = field(default_factory=list)

    def read(self, store: ChangelogStore, span: int) -> None:
        """Process the positions up to ``span`` after its own (a range, as the Spark sources
        read: compaction leaves gaps), then commit the end of the range."""
        upper = min(store.head(STREAM), self.position + span)
        records = [r for r in store.read(STREAM, self.position + 1, 100_000).to_pylist()
                   if r["_position"] <= upper]
        for record in records:
            op, key, value = record["_op"], record["id"], record["v"]
            self.seen.append((record["_position"], op, key, value))
            if op == "truncate":
                self.state.clear()
            elif op == "delete":
                self.state.pop(key, None)
            else:
                self.state[key] = value
        self.position = max(self.position, upper)
        store.commit_reader(self.name, STREAM, self.position, history=self.history)


_ACTIONS = st.one_of(
    st.tuples(st.just("write"), st.lists(st.tuples(st.integers(0, 3), st.integers(1, KEYS)),
                                         min_size=1, max_size=12)),
    st.tuples(st.just("read_latest"), st.integers(1, 15)),
    st.tuples(st.just("read_history"), st.integers(1, 15)),
    st.tuples(st.just("compact"), st.integers(1, 7)),
)
_WORKLOADS = st.lists(_ACTIONS, min_size=3, max_size=9)


def _truncates_rarely(choices: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """A truncate only as the first change of a write (so most writes build on the rows)."""
    return [c for i, c in enumerate(choices) if c[0] != 3 or i == 0]


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(workload=_WORKLOADS)
def test_readers_miss_nothing_whatever_compaction_does(pg: TestDatabase,
                                                        workload: list[Any]) -> None:
    if not _state.get(pg.name):  # one database for all examples: the stream goes on
        config, model = _setup(pg), _Model()
        _write(pg.dsn, model, [(1, k) for k in range(1, KEYS + 1)])
        capture_now(config)
        _state[pg.name] = {"config": config, "model": model, "ids": count()}
    config, model, ids = (_state[pg.name][k] for k in ("config", "model", "ids"))
    example = next(ids)
    with ChangelogStore(pg.dsn) as store:
        for left in store.readers():  # by an example that failed (hypothesis shrinks it)
            store.release_reader(left.reader)
        # record n of the stream is change n of the model (one statement, one record)
        assert store.head(STREAM) == len(model.changes)
        start = store.head(STREAM) if example else 0
        # the latest-state reader starts from the beginning (as a rebuild does), the history
        # reader at the head (or at 0 before anything was compacted): both may
        latest = _Reader(f"latest-{example}", history=False)
        history = _Reader(f"history-{example}", history=True, position=start)
        store.commit_reader(latest.name, STREAM, 0)
        store.commit_reader(history.name, STREAM, start, history=True)
        before = store.compaction_state(STREAM)
        for action, argument in workload:
            if action == "write":
                _write(pg.dsn, model, _truncates_rarely(argument))
                capture_now(config)
            elif action == "compact":
                store.compact(STREAM, tombstone_retention=timedelta(0),
                              chunk_positions=argument)
                state = store.compaction_state(STREAM)
                lowest = min(latest.position, history.position)
                assert state.compacted_to <= max(before.compacted_to, lowest)
                assert state.removed_to <= max(before.removed_to, lowest)
                assert state.expired_to <= max(before.expired_to, lowest)
            else:
                (latest if action == "read_latest" else history).read(store, argument)
        head = store.head(STREAM)
        while latest.position < head or history.position < head:
            latest.read(store, 50)
            history.read(store, 50)
        assert latest.state == {k: r["v"] for k, r in source_rows(pg.dsn, STREAM).items()}
        assert latest.state == model.rows
        assert [s[0] for s in history.seen] == list(range(start + 1, head + 1))
        assert [s[1:] for s in history.seen] == model.changes[start:]
        # what a rebuild gets: a new latest-state reader of the compacted stream reads the
        # table; a new history reader is refused once compaction removed anything
        store.compact(STREAM, tombstone_retention=timedelta(0))
        assert store.compaction_state(STREAM).compacted_to == head
        rebuilt = _Reader(f"rebuilt-{example}", history=False)
        store.commit_reader(rebuilt.name, STREAM, 0)  # registered before it reads
        while rebuilt.position < head:
            rebuilt.read(store, 50)
        assert rebuilt.state == model.rows
        state = store.compaction_state(STREAM)
        if state.removed_to:
            with pytest.raises(ReaderBehindCompactionError):
                store.commit_reader(f"history-new-{example}", STREAM, 0, history=True)
        for reader in (latest, history, rebuilt):
            assert store.release_reader(reader.name) == 1


_state: dict[str, dict[str, Any]] = {}


def test_a_reader_whose_registration_was_lost_is_refused(pg: TestDatabase) -> None:
    config = _setup(pg)
    model = _Model()
    _write(pg.dsn, model, [(1, k) for k in range(1, KEYS + 1)])
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        store.commit_reader("cache", STREAM, 3)
        store.commit_reader("log", STREAM, 3, history=True)
        _write(pg.dsn, model, [(2, 1), (0, 2), (2, 3), (0, 4), (2, 1)])
        capture_now(config)
        store.compact(STREAM, tombstone_retention=timedelta(0))
        held = store.compaction_state(STREAM)
        assert held.compacted_to == 3 and held.expired_to == 0
        assert held.held_by is not None and held.held_by.position == 3
        assert {r.reader for r in held.readers} == {"cache", "log"}

        assert store.release_reader("cache") == 1 and store.release_reader("log") == 1
        store.compact(STREAM, tombstone_retention=timedelta(0))
        state = store.compaction_state(STREAM)
        assert state.compacted_to == store.head(STREAM) and state.expired_to > 3
        with pytest.raises(ReaderBehindCompactionError) as latest:
            store.commit_reader("cache", STREAM, 3)
        message = str(latest.value)
        for part in ("cache", STREAM, "position 3", f"position {state.expired_to}",
                     "deletes", "from the start"):
            assert part in message, (part, message)
        assert latest.value.stream == STREAM and latest.value.position == 3
        with pytest.raises(ReaderBehindCompactionError) as history:
            store.commit_reader("log", STREAM, 0, history=True)
        assert f"position {state.removed_to}" in str(history.value)
        assert "keep-history" in str(history.value)
        assert store.readers(STREAM) == []  # a refused reader is not registered
        store.commit_reader("cache", STREAM, 0)  # a latest-state rebuild may start
        with pytest.raises(ValueError, match="0 or more"):
            store.commit_reader("cache", STREAM, -1)


def test_a_stream_that_keeps_its_history_is_not_compacted(pg: TestDatabase,
                                                         caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    config = _setup(pg)
    model = _Model()
    _write(pg.dsn, model, [(1, k % KEYS + 1) for k in range(30)] + [(0, 1)])
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        head = store.head(STREAM)
        assert store.keep_history(STREAM, reason="projection h (delta scd2)", if_unset=True)
        assert not store.keep_history(STREAM, reason="again")  # no change
        assert store.compact(STREAM, tombstone_retention=timedelta(0)) == {STREAM: 0}
        assert len(store.read(STREAM, 1, 1000)) == head
        state = store.compaction_state(STREAM)
        assert state.keep_history and state.keep_history_reason == "projection h (delta scd2)"
        store.commit_reader("new-history", STREAM, 0, history=True)

        assert store.keep_history(STREAM, False)
        # what a history view asks for when registered does not undo a user's decision
        assert not store.keep_history(STREAM, reason="projection h2", if_unset=True)
        assert not store.compaction_state(STREAM).keep_history
        store.commit_reader("paused", STREAM, 10)
        with caplog.at_level(logging.INFO, logger="lakefold.store._compaction"):
            store.compact(STREAM, tombstone_retention=timedelta(0))
        held = [r.getMessage() for r in caplog.records if "held at position" in r.getMessage()]
        assert held and "new-history" in held[0] and "position 0" in held[0]
        assert store.compaction_state(STREAM).removed == 0
        store.release_reader("new-history")
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="lakefold.store._compaction"):
            store.compact(STREAM, tombstone_retention=timedelta(0))
        state = store.compaction_state(STREAM)
        assert state.compacted_to == 10 and 0 < state.removed_to <= 10
        warned = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert warned and "paused" in warned[0].getMessage()
        assert "lakefold capture release-reader paused" in warned[0].getMessage()


def test_cli_shows_what_holds_compaction_and_changes_it(pg: TestDatabase) -> None:
    config = _setup(pg)
    _write(pg.dsn, _Model(), [(1, k % KEYS + 1) for k in range(20)])
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        store.commit_reader("projection:v@g1", STREAM, 7)
        store.compact(STREAM, tombstone_retention=timedelta(0))
    cli = CliRunner()
    listed = cli.invoke(app, ["capture", "streams", "--store-dsn", pg.dsn, "--json"])
    assert listed.exit_code == 0, listed.output
    (stream,) = json.loads(listed.stdout)
    assert stream["compaction"]["compacted_to"] == 7
    assert stream["compaction"]["held_by"]["reader"] == "projection:v@g1"
    human = cli.invoke(app, ["capture", "streams", "--store-dsn", pg.dsn])
    assert "projection:v@g1" in human.stdout

    kept = cli.invoke(app, ["capture", "keep-history", STREAM, "--store-dsn", pg.dsn])
    assert kept.exit_code == 0, kept.output
    released = cli.invoke(app, ["capture", "release-reader", "projection:v@g1",
                                "--store-dsn", pg.dsn])
    assert released.exit_code == 0 and "1" in released.stdout
    with ChangelogStore(pg.dsn) as store:
        state = store.compaction_state(STREAM)
        assert state.keep_history and state.readers == ()
    unknown = cli.invoke(app, ["capture", "release-reader", "nobody", "--store-dsn", pg.dsn])
    assert unknown.exit_code != 0 and "nobody" in str(unknown.exception)


def test_a_store_compacted_before_removed_to_existed_counts_it_removed(pg: TestDatabase
                                                                       ) -> None:
    config = _setup(pg)
    _write(pg.dsn, _Model(), [(1, k % KEYS + 1) for k in range(20)])
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        store.compact(STREAM, tombstone_retention=timedelta(0))
        compacted_to = store.compaction_state(STREAM).compacted_to
    # the store as the release before readers left it (which did not note its installs)
    execute(pg.dsn, "DROP TABLE lakefold.store_installs", "DROP TABLE lakefold.changelog_readers",
            "ALTER TABLE lakefold.changelog_compaction DROP COLUMN removed_to, "
            "DROP COLUMN expired_to, DROP COLUMN keep_history, DROP COLUMN keep_history_reason")
    with ChangelogStore(pg.dsn) as store:
        assert store.readers() == []
        state = store.compaction_state(STREAM)  # installs what is missing
        assert (state.removed_to, state.expired_to) == (compacted_to, compacted_to)
        with pytest.raises(ReaderBehindCompactionError):
            store.commit_reader("old", STREAM, 1)
