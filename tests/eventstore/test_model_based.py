"""Property test: random sequences of appends, retries, deletions and sealing give the same
outcomes, streams and global order on PostgreSQL as on the in-memory reference recorder, and
the bulk read (sealed segments and rows) returns the reference's log."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from psycopg import sql

from lakefold.eventstore import (
    ANY,
    NO_STREAM,
    STREAM_EXISTS,
    EventStore,
    EventStoreError,
    StoreOptions,
    StreamEvents,
    WrongExpectedVersionError,
)
from lakefold.eventstore.arrow import read_events_range
from lakefold.schemas import NewEvent
from tests.fixtures.postgres import PostgresServer, drop_database

STREAMS = ["order-1", "order-2", "cart-1"]
expected_versions = st.one_of(st.sampled_from([ANY, NO_STREAM, STREAM_EXISTS]),
                              st.integers(min_value=0, max_value=4))


def _outcome(call: Any) -> Any:
    try:
        result = call()
    except WrongExpectedVersionError as e:
        return ("wrong expected version", e.stream_id, e.actual_version)
    except EventStoreError as e:
        return (type(e).__name__,)
    if hasattr(result, "stream_versions"):
        return ("ok", result.duplicate, result.stream_versions)
    return ("ok", result.stream_id, result.stream_version, result.data)


def _log(store: EventStore, include_deleted: bool) -> list[tuple[Any, ...]]:
    return [(e.position, e.event_id if e.type != "$stream.deleted" else None, e.stream_id,
             e.stream_version, e.type, e.data)
            for e in store.read_all(0, 10_000, include_deleted=include_deleted)]


@pytest.mark.timeout(240)
def test_postgres_matches_the_in_memory_reference(postgres_server: PostgresServer) -> None:
    seen: set[Any] = set()

    class Machine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.db = f"m_{uuid.uuid4().hex[:10]}"
            with psycopg.connect(postgres_server.admin_dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.db)))
            self.dsn = postgres_server.dsn_for(self.db)
            # tiny segments, sealed by the background sealer and by the seal rule
            self.pg = EventStore(self.dsn, options=StoreOptions(segment_positions=3))
            self.pg.install()
            self.memory = EventStore.in_memory()
            self.sent: list[list[StreamEvents]] = []

        def both(self, action: Any) -> None:
            outcome = _outcome(lambda: action(self.pg))
            assert outcome == _outcome(lambda: action(self.memory))
            seen.add(outcome[0] if outcome[0] != "ok" else ("ok", outcome[1]))

        @rule(stream=st.sampled_from(STREAMS), count=st.integers(1, 3),
              expected=expected_versions, other=st.none() | st.sampled_from(STREAMS))
        def append(self, stream: str, count: int, expected: Any, other: str | None) -> None:
            parts = [StreamEvents(stream, [NewEvent("thing", {"n": i}) for i in range(count)],
                                  expected)]
            if other is not None and other != stream:
                parts.append(StreamEvents(other, [NewEvent("other", {})]))
            self.sent.append(parts)
            self.both(lambda store: store.append_streams(parts))

        @rule(data=st.data())
        def retry(self, data: st.DataObject) -> None:
            if self.sent:
                parts = data.draw(st.sampled_from(self.sent))
                self.both(lambda store: store.append_streams(parts))

        @rule(stream=st.sampled_from(STREAMS), hard=st.booleans(), expected=expected_versions)
        def delete(self, stream: str, hard: bool, expected: Any) -> None:
            self.both(lambda store: store.delete_stream(stream, hard=hard,
                                                        expected_version=expected))

        @rule()
        def seal(self) -> None:
            self.pg.seal()

        @invariant()
        def same_streams_and_log(self) -> None:
            for stream in STREAMS:
                for deleted in (False, True):
                    mine = [(e.stream_version, e.type, e.data)
                            for e in self.pg.read_stream(stream, include_deleted=deleted)]
                    theirs = [(e.stream_version, e.type, e.data)
                              for e in self.memory.read_stream(stream, include_deleted=deleted)]
                    assert mine == theirs
                assert self.pg.stream_state(stream) == self.memory.stream_state(stream)
            assert self.pg.head() == self.memory.head()
            for deleted in (False, True):
                assert _log(self.pg, deleted) == _log(self.memory, deleted)
            bulk = [(p, s, v, t, json.loads(d)) for b in read_events_range(
                self.dsn, 1, self.pg.head() + 1) for p, s, v, t, d in zip(
                *(b.column(c).to_pylist() for c in ("position", "stream_id", "stream_version",
                                                   "type", "data")), strict=True)]
            assert bulk == [(p, s, v, t, d) for p, _, s, v, t, d in _log(self.memory, False)]

        def teardown(self) -> None:
            self.pg.close()
            drop_database(postgres_server, self.db)

    run_state_machine_as_test(Machine, settings=settings(
        max_examples=25, stateful_step_count=20, deadline=None, derandomize=True,
        suppress_health_check=[HealthCheck.too_slow]))
    # the runs covered successes, idempotent retries, conflicts and deleted streams
    assert {("ok", False), ("ok", True), "wrong expected version",
            "StreamDeletedError"} <= seen, seen
