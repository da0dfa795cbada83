"""Windows over a captured table's time column: orders per minute (tumbling) and per 3 minutes
sliding by one (hopping) over ``placed.placed_at``, while rows are inserted, moved in time,
changed, given no time, and deleted, a few behind the watermark. After every batch each view
equals the windows of the rows the feed holds, simulated from the statements in commit order
with the lateness rule; the rows held equal the table's rows except where a late change was
not applied, each late change is listed, ``window_final`` follows the watermark, a rebuild gives
the live rows and a TRUNCATE empties every window."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from lakefold.capture import Capture, CaptureConfig
from lakefold.projections import DeadLetters, Runner, RunnerConfig, hopping, session, tumbling
from lakefold.projections.definitions._api import Registry, registering_into, view
from lakefold.projections.definitions._model import changelog
from lakefold.projections.definitions._target_specs import delta_table
from lakefold.projections.exceptions import ProjectionDefinitionError
from lakefold.projections.operations import Catalog, SinkRoots
from lakefold.projections.runtime._view_validation import plan_views
from lakefold.projections.state._late_events import replay_late
from tests.capture.conftest import capture_now, execute
from tests.fixtures.postgres import TestDatabase
from tests.projections.window_oracle import micros, table

pytestmark = pytest.mark.timeout(600)

BASE = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)
MINUTE = 60_000_000
LATENESS = 2 * MINUTE
QUERY = ("SELECT window_start, window_end, count(*) AS orders, sum(amount) AS amount FROM o "
         "GROUP BY window_start, window_end")
# name → (size, slide) in microseconds
WINDOWS = {"placed_per_minute": (MINUTE, MINUTE), "placed_per_3_minutes": (3 * MINUTE, MINUTE)}


def _registry() -> Registry:
    registry = Registry()
    with registering_into(registry):
        view("placed_per_minute", inputs={"o": changelog("public.placed")}, key="window_start",
             query=QUERY, target=delta_table("upsert", keys=["window_start"]),
             window=tumbling("o.placed_at", "1 minute", lateness="2 minutes"))
        view("placed_per_3_minutes", inputs={"o": changelog("public.placed")},
             key="window_start", query=QUERY,
             target=delta_table("upsert", keys=["window_start"]),
             window=hopping("o.placed_at", "3 minutes", "1 minute", lateness="2 minutes"))
    return registry


@pytest.fixture
def placed(pg: TestDatabase) -> CaptureConfig:
    execute(pg.dsn, "CREATE TABLE placed (id int PRIMARY KEY, placed_at timestamptz, "
                    "amount int NOT NULL)",
            f"INSERT INTO placed SELECT i, '{BASE.isoformat()}'::timestamptz "
            "+ i * interval '10 seconds', i FROM generate_series(1, 4) i")
    config = CaptureConfig(source_dsn=pg.dsn, tables=("placed",), slot="windows")
    Capture(config).setup()
    return config


class Simulation:
    """The rows the feed holds, by the lateness rule, from the statements in commit order."""

    def __init__(self, rows: dict[int, tuple[int | None, int]]) -> None:
        self.top: int | None = max((t for t, _ in rows.values() if t is not None), default=None)
        #: Per view: (window start, time) of each late change; the rows its feed holds; the
        #: keys whose newest change was late (the feed holds an earlier version).
        self.late: dict[str, list[tuple[int, int]]] = {name: [] for name in WINDOWS}
        self.per_view = {name: dict(rows) for name in WINDOWS}
        self.stale_in = {name: set[int]() for name in WINDOWS}

    @staticmethod
    def starts(at: int | None, size: int, slide: int) -> set[int]:
        if at is None:
            return set()
        last = at // slide * slide
        return {last - b * slide for b in range(size // slide) if last - b * slide + size > at}

    def change(self, key: int, new: tuple[int | None, int] | None) -> None:
        if new is not None and new[0] is not None:
            self.top = new[0] if self.top is None else max(self.top, new[0])
        watermark = None if self.top is None else self.top - LATENESS
        for name, (size, slide) in WINDOWS.items():
            rows = self.per_view[name]
            old = rows.get(key)
            if new is not None and new == old and new[0] is not None:
                continue  # changes nothing the feed holds
            windows = self.starts(old[0] if old else None, size, slide) | \
                self.starts(new[0] if new else None, size, slide)
            closed = sorted(s for s in windows if watermark is not None and
                            s + size <= watermark)
            if closed:
                at = (new or old or (None, 0))[0]
                self.late[name] += [(s, at if at is not None else s) for s in closed]
                self.stale_in[name].add(key)
                continue
            self.stale_in[name].discard(key)
            if new is None:
                rows.pop(key, None)
            else:
                rows[key] = new

    def expected(self, name: str) -> dict[int, tuple[int, int]]:
        size, slide = WINDOWS[name]
        out: dict[int, list[int]] = {}
        for at, amount in self.per_view[name].values():
            for start in self.starts(at, size, slide):
                totals = out.setdefault(start, [0, 0])
                totals[0] += 1
                totals[1] += amount
        return {k: (v[0], v[1]) for k, v in out.items()}


def _source(dsn: str) -> dict[int, tuple[int | None, int]]:
    with psycopg.connect(dsn) as conn:
        return {int(i): (None if at is None else micros(at), int(amount)) for i, at, amount in
                conn.execute("SELECT id, placed_at, amount FROM placed")}


def _check(dsn: str, catalog: Catalog, sim: Simulation) -> None:
    source = _source(dsn)
    watermark = -2**62 if sim.top is None else sim.top - LATENESS
    for name, (size, _) in WINDOWS.items():
        # what the feed holds is the table, but for rows whose newest change came late
        held = sim.per_view[name]
        assert {k: v for k, v in held.items() if k not in sim.stale_in[name]} == \
            {k: v for k, v in source.items() if k not in sim.stale_in[name]}
        rows = table(catalog, name)
        got = {micros(r["window_start"]): (r["orders"], r["amount"]) for r in rows}
        assert got == sim.expected(name), name
        assert [r for r in rows if r["window_final"] != (micros(r["window_start"]) + size
                                                         <= watermark)] == [], watermark
        with psycopg.connect(dsn) as conn:
            listed = sorted((micros(s), micros(t)) for s, t, kind in conn.execute(
                "SELECT window_start, event_time, kind FROM lakefold.late_events "
                "WHERE view = %s", (name,)) if kind == "change")
        assert listed == sorted(sim.late[name]), name


# a statement: (what, id, seconds, amount)
STATEMENTS = st.lists(st.lists(st.tuples(
    st.sampled_from(["insert", "insert", "move", "amount", "untime", "delete"]),
    st.integers(1, 12), st.integers(-400, 90), st.integers(1, 50)),
    min_size=3, max_size=15), min_size=1, max_size=3)


def test_windows_over_a_table_equal_the_simulated_rows(spark: Any, placed: CaptureConfig,
                                                       tmp_path: Path) -> None:
    dsn = placed.source_dsn
    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(tmp_path), poll_seconds=0.05)
    sim = Simulation(_source(dsn))
    clock = [BASE + dt.timedelta(minutes=1)]

    def apply(conn: psycopg.Connection[Any], what: str, key: int, seconds: int,
              amount: int) -> None:
        """Run one statement; the simulation sees every row it wrote (PostgreSQL logs an
        update that changes nothing, too)."""
        statement: tuple[str, tuple[Any, ...]]
        if what == "insert":
            clock[0] += dt.timedelta(seconds=abs(seconds) % 60)
            at = clock[0] + dt.timedelta(seconds=min(seconds, 0))
            statement = ("INSERT INTO placed VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                         (key, at, amount))
        elif what == "move":
            statement = ("UPDATE placed SET placed_at = %s WHERE id = %s",
                         (clock[0] + dt.timedelta(seconds=seconds), key))
        elif what == "amount":
            statement = ("UPDATE placed SET amount = %s WHERE id = %s", (amount, key))
        elif what == "untime":
            statement = ("UPDATE placed SET placed_at = NULL WHERE id = %s", (key,))
        else:
            statement = ("DELETE FROM placed WHERE id = %s", (key,))
        if conn.execute(*statement).rowcount:
            sim.change(key, _source(dsn).get(key))

    @settings(max_examples=5, deadline=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(STATEMENTS)
    def run(batches: list[list[tuple[str, int, int, int]]]) -> None:
        with Runner(spark, _registry(), config) as runner, Catalog(dsn) as catalog, \
                psycopg.connect(dsn, autocommit=True) as conn:
            for batch in batches:
                for statement in batch:
                    apply(conn, *statement)
                capture_now(placed)
                runner.run(until_caught_up=True, timeout=120)
                _check(dsn, catalog, sim)

    run()
    with Catalog(dsn) as catalog, psycopg.connect(dsn, autocommit=True) as conn:
        assert any(sim.late.values()), "the workload made no late change"
        untimed = [k for k, (at, _) in _source(dsn).items() if at is None]
        if untimed:  # a row without a time is a dead letter, saying why
            letters = DeadLetters(catalog).find("placed_per_minute", status="open")
            assert letters and "placed_at is NULL; it is in no window" in letters[0].error
        with pytest.raises(ProjectionDefinitionError, match="the row may have changed"):
            replay_late(conn, "placed_per_minute")
        live = {n: sorted(map(repr, table(catalog, n))) for n in WINDOWS}
        with Runner(spark, _registry(), config) as runner:
            for name in WINDOWS:
                runner.request_rebuild(name)
            runner.run(until_caught_up=True, timeout=240)
        for name in WINDOWS:
            assert catalog.current(name).generation == 2
            assert sorted(map(repr, table(catalog, name))) == live[name]
        conn.execute("TRUNCATE placed")
        capture_now(placed)
        with Runner(spark, _registry(), config) as runner:
            runner.run(until_caught_up=True, timeout=120)
        for name in WINDOWS:
            assert table(catalog, name) == []


def test_session_windows_over_a_table_are_refused(spark: Any, placed: CaptureConfig) -> None:
    with pytest.raises(ProjectionDefinitionError, match="session windows are over event"):
        view("s", inputs={"o": changelog("public.placed")}, key="window_start", query=QUERY,
             target=delta_table("upsert", keys=["window_start"]),
             window=session("o.placed_at", "1 minute", by="id"))
    capture_now(placed)
    registry = Registry()
    with registering_into(registry):
        view("t", inputs={"o": changelog("public.placed")}, key="window_start", query=QUERY,
             target=delta_table("upsert", keys=["window_start"]),
             window=tumbling("o.amount", "1 minute"))
    with pytest.raises(ProjectionDefinitionError, match="of type int32, which is not a time"):
        plan_views(spark, registry.views, placed.source_dsn)
