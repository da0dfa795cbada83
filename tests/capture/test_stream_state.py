"""Stream states: the latest row per key of a changelog stream, moved forward a range at a
time, equal to the source table after every range, whatever the source did in between."""

from __future__ import annotations

import itertools
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from psycopg import sql

from lakefold.capture import Capture, CaptureConfig, SnapshotPolicy
from lakefold.projections.state._stream_state import LatestRows, state_table_name
from lakefold.store.exceptions import StoreError
from tests.capture.conftest import capture_now, execute, source_rows
from tests.fixtures.postgres import TestDatabase

pytestmark = pytest.mark.timeout(300)

_GROUPS = ("a", "b", "c", "tab\there", "", None)
_owners = itertools.count()


@pytest.fixture
def source(pg: TestDatabase) -> CaptureConfig:
    """public.t with 12 rows copied by the initial snapshot (snapshot segments), captured."""
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY, g text, n numeric(8, 2))",
            "INSERT INTO t SELECT i, 'a', i / 4.0 FROM generate_series(1, 12) i")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot="states",
                           snapshot=SnapshotPolicy(chunk_rows=5))
    Capture(config).setup()
    capture_now(config)
    return config


def _state_rows(conn: psycopg.Connection[Any], state: LatestRows) -> dict[int, dict[str, Any]]:
    typed = state.typed(conn, state.rows(conn))
    return {row["id"]: {k: row[k] for k in ("id", "g", "n")} for row in typed.to_pylist()}


def _ids(conn: psycopg.Connection[Any], state: LatestRows, raw: Any) -> set[int]:
    return {row["id"] for row in state.typed(conn, raw).to_pylist()}


_op = st.one_of(
    st.tuples(st.just("insert"), st.integers(1, 20), st.sampled_from(_GROUPS),
              st.integers(0, 9999)),
    st.tuples(st.just("update"), st.integers(1, 20), st.sampled_from(_GROUPS),
              st.integers(0, 9999)),
    st.tuples(st.just("rekey"), st.integers(1, 20), st.integers(1, 20)),
    st.tuples(st.just("delete"), st.integers(1, 20)),
    st.tuples(st.just("truncate"),),
)
_transaction = st.lists(_op, min_size=1, max_size=6)
_round = st.lists(_transaction, min_size=1, max_size=3)


def _run(conn: psycopg.Connection[Any], op: tuple[Any, ...]) -> None:
    kind = op[0]
    if kind == "insert":
        conn.execute("INSERT INTO t VALUES (%s, %s, %s / 100.0) ON CONFLICT (id) DO UPDATE "
                     "SET g = excluded.g, n = excluded.n", op[1:])
    elif kind == "update":
        conn.execute("UPDATE t SET g = %s, n = %s / 100.0 WHERE id = %s", (op[2], op[3], op[1]))
    elif kind == "rekey":
        conn.execute("UPDATE t SET id = %s WHERE id = %s AND NOT EXISTS "
                     "(SELECT FROM t WHERE id = %s)", (op[2], op[1], op[2]))
    elif kind == "delete":
        conn.execute("DELETE FROM t WHERE id = %s", (op[1],))
    else:
        conn.execute("TRUNCATE t")


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(rounds=st.lists(_round, min_size=1, max_size=4))
def test_a_state_equals_the_source_table_after_every_range(
        source: CaptureConfig, rounds: list[list[list[tuple[Any, ...]]]]) -> None:
    dsn = source.source_dsn
    state = LatestRows(f"test-{next(_owners)}", "public.t")
    with psycopg.connect(dsn, autocommit=True) as store:
        state.create(store, lookups=["g"])
        first = state.apply(store, 2**62)  # the whole stream so far: snapshot segments too
        assert first.start == 1
        assert _state_rows(store, state) == source_rows(dsn, "t")
        for transactions in rounds:
            previous = _state_rows(store, state)
            for operations in transactions:
                with psycopg.connect(dsn) as conn, conn.transaction():
                    for op in operations:
                        _run(conn, op)
            capture_now(source)
            changes = state.apply(store, 2**62)
            now = source_rows(dsn, "t")
            assert _state_rows(store, state) == now
            # The before-images are rows the state held; the after-images are rows it holds.
            before, after = _ids(store, state, changes.before), _ids(store, state, changes.after)
            assert before <= set(previous) and after <= set(now)
            for key in set(previous) | set(now):
                if previous.get(key) != now.get(key):  # every key that changed is in one
                    assert key in before | after
            if changes.truncated:
                assert before == set(previous)
            for group in _GROUPS:
                found = state.typed(store, state.rows_where(store, "g", [group]))
                assert sorted(found.column("id").to_pylist()) == sorted(
                    k for k, row in now.items() if row["g"] == group)
            assert state.position(store) == changes.end
            assert state.apply(store, 2**62).empty  # nothing new: nothing applied twice


def test_a_state_is_applied_in_its_callers_transaction(source: CaptureConfig) -> None:
    dsn = source.source_dsn
    state = LatestRows("rolled-back", "public.t")
    with psycopg.connect(dsn, autocommit=True) as store:
        state.create(store)
        with pytest.raises(RuntimeError), store.transaction():
            changes = state.apply(store, 2**62)
            assert changes.after.num_rows == 12
            raise RuntimeError("the caller's batch record failed")
        assert state.position(store) == 1 and _state_rows(store, state) == {}
        execute(dsn, "UPDATE t SET n = 0 WHERE id = 3")
        capture_now(source)
        state.apply(store, 5)  # a range ending inside the snapshot
        assert sorted(_state_rows(store, state)) == [1, 2, 3, 4]
        state.apply(store, 2**62)
        assert _state_rows(store, state)[3]["n"] == Decimal("0.00")


def test_a_state_maps_columns_across_schema_versions(source: CaptureConfig) -> None:
    dsn = source.source_dsn
    state = LatestRows("versions", "public.t")
    with psycopg.connect(dsn, autocommit=True) as store:
        state.create(store, lookups=["g"])
        state.apply(store, 2**62)
        execute(dsn, "ALTER TABLE t ADD COLUMN extra int", "ALTER TABLE t DROP COLUMN n",
                "UPDATE t SET g = 'z', extra = 7 WHERE id IN (1, 2)")
        capture_now(source)
        state.apply(store, 2**62)
        typed = state.typed(store, state.rows_where(store, "g", ["a", "z"]))
        rows = {r["id"]: (r["g"], r["extra"]) for r in typed.to_pylist()}
        assert rows == {1: ("z", 7), 2: ("z", 7)} | {i: ("a", None) for i in range(3, 13)}
        assert state.raw_column(store, state.rows_where(store, "g", ["z"]), "g") == ["z", "z"]
        with pytest.raises(StoreError, match="no column 'nope'; its columns are id, g, extra"):
            state.rows_where(store, "nope", ["x"])


def test_states_are_private_to_their_owner_and_dropped_whole(source: CaptureConfig) -> None:
    dsn = source.source_dsn
    mine, theirs = LatestRows("view@1", "public.t"), LatestRows("view@2", "public.t")
    with psycopg.connect(dsn, autocommit=True) as store:
        for state in (mine, theirs):
            state.create(store, lookups=["g"])
        mine.apply(store, 2**62)
        assert len(_state_rows(store, mine)) == 12 and _state_rows(store, theirs) == {}
        mine.drop(store)
        mine.drop(store)  # idempotent
        gone = store.execute("SELECT to_regclass(%s)", (
            sql.Identifier("lakefold_state", state_table_name("view@1", "public.t"))
            .as_string(store),)).fetchone()
        assert gone == (None,)
        with pytest.raises(StoreError, match=r"no state of public\.t for view@1"):
            mine.position(store)
        assert theirs.position(store) == 1
