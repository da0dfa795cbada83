"""Session windows: visits per user, sessions of events less than 5 minutes apart, with event
times out of order and late. After every batch the view equals SQL over ``lakefold.events``
(gaps and islands over the events that were not late), late events are exactly those that
would have changed a closed session (listed, never counted), ``window_final`` says whether the
watermark passed a session's end, ``emit="final"`` writes only final sessions, and a rebuild fed
a few events per batch gives the live rows. Sessions that cannot work are refused."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from pydantic import BaseModel

from lakefold.eventstore import EventStore
from lakefold.projections import DeadLetters, ProjectionOptions, Runner, RunnerConfig, session
from lakefold.projections.definitions._api import Registry, registering_into, view
from lakefold.projections.definitions._model import events
from lakefold.projections.definitions._target_specs import delta_table
from lakefold.projections.exceptions import MissingKeyError, ProjectionDefinitionError
from lakefold.projections.operations import Catalog, SinkRoots
from lakefold.projections.runtime._view_validation import plan_views
from lakefold.projections.state._late_events import replay_late
from lakefold.schemas import EventRegistry, NewEvent
from tests.fixtures.postgres import TestDatabase
from tests.projections.window_oracle import micros, table

pytestmark = pytest.mark.timeout(600)

BASE = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)
MINUTE = 60_000_000
GAP = 5 * MINUTE
LATENESS = 2 * MINUTE
QUERY = ("SELECT window_start, window_end, user, count(*) AS pages, sum(ms) AS ms FROM v "
         "GROUP BY window_start, window_end, user")
KEY = ["window_start", "user"]


class Visited(BaseModel):
    user: str
    ms: int
    occurred_at: dt.datetime | None = None


def _types() -> EventRegistry:
    registry = EventRegistry()
    registry.add(Visited, name="visited")
    return registry


def define_sessions(batch: int | None = None) -> None:
    """Register the session views (into the current registry; also the SIGKILL loop's)."""
    options = ProjectionOptions(max_records_per_batch=batch) if batch else None
    for name, emit in (("visits", "updates"), ("final_visits", "final")):
        view(name, inputs={"v": events("visit", types=["visited"])}, key=KEY, query=QUERY,
             target=delta_table("upsert", keys=KEY), registry=_types(), options=options,
             window=session("v.occurred_at", "5 minutes", by="user",
                            lateness="2 minutes", emit=emit))


def _registry(batch: int | None = None) -> Registry:
    registry = Registry()
    with registering_into(registry):
        define_sessions(batch)
    return registry


def append_visit(store: EventStore, user: str, at: dt.datetime | None, ms: int) -> None:
    """Append a visit of ``user`` at ``at`` (None: without a time)."""
    data: dict[str, Any] = {"user": user, "ms": ms}
    if at is not None:
        data["occurred_at"] = at.isoformat()
    store.append(f"visit-{user}", [NewEvent(type="visited", data=data)])


def _expected(dsn: str) -> tuple[dict[tuple[int, str], tuple[int, int, int]], set[int], int]:
    """What SQL says: (session start, user) → (end, pages, ms), the late positions, and the
    watermark."""
    with psycopg.connect(dsn) as conn:
        events_ = conn.execute(
            "SELECT p.first_position + e.ordinal, e.data->>'user', (e.data->>'ms')::bigint, "
            "(extract(epoch FROM (e.data->>'occurred_at')::timestamptz) * 1000000)::bigint "
            "FROM lakefold.events e JOIN lakefold.event_positions p USING (xid) "
            "WHERE e.category = 'visit' ORDER BY 1").fetchall()
        # lateness by the log: an event is late when it would change a closed session
        top: int | None = None
        late: set[int] = set()
        kept: list[tuple[int, str, int, int]] = []
        for position, user, ms, at in events_:
            if at is None:
                continue
            top = at if top is None else max(top, at)
            watermark = top - LATENESS
            times = sorted(t for _, u, _, t in kept if u == user)
            islands: list[list[int]] = []
            for t in times:
                if islands and t - islands[-1][-1] < GAP:
                    islands[-1].append(t)
                else:
                    islands.append([t])
            touching = [i for i in islands if i[0] - GAP < at < i[-1] + GAP]
            if any(i[-1] + GAP <= watermark for i in touching) or (
                    not touching and at + GAP <= watermark):
                late.add(position)
            else:
                kept.append((position, user, ms, at))
        conn.execute("CREATE TEMP TABLE kept (position bigint, usr text, ms bigint, at bigint)")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO kept VALUES (%s, %s, %s, %s)", kept)
        rows = conn.execute(
            "WITH g AS (SELECT *, CASE WHEN at - lag(at) OVER w >= %(gap)s THEN 1 ELSE 0 END "
            "  AS brk FROM kept WINDOW w AS (PARTITION BY usr ORDER BY at, position)), "
            "s AS (SELECT *, sum(brk) OVER (PARTITION BY usr ORDER BY at, position) AS sid "
            "  FROM g) "
            "SELECT min(at), usr, max(at) + %(gap)s, count(*), sum(ms) FROM s "
            "GROUP BY usr, sid", {"gap": GAP}).fetchall()
    expected = {(int(s), u): (int(e), int(n), int(m)) for s, u, e, n, m in rows}
    return expected, late, (-2**62 if top is None else top - LATENESS)


def check_sessions(dsn: str, catalog: Catalog) -> None:
    """Both session views equal SQL, and their late events are listed."""
    expected, late, watermark = _expected(dsn)
    for name in ("visits", "final_visits"):
        rows = table(catalog, name)
        got = {(micros(r["window_start"]), r["user"]): (micros(r["window_end"]), r["pages"],
                                                          r["ms"]) for r in rows}
        wanted = expected if name == "visits" else \
            {k: v for k, v in expected.items() if v[0] <= watermark}
        assert got == wanted, name
        assert all(r["window_final"] == (micros(r["window_end"]) <= watermark) for r in rows)
        with psycopg.connect(dsn) as conn:
            listed = conn.execute("SELECT position, kind FROM lakefold.late_events "
                                  "WHERE view = %s", (name,)).fetchall()
        assert {p for p, _ in listed} == late and all(k == "session" for _, k in listed)


# a batch: events as (user, seconds after the previous event's base time, delay in seconds
# behind it, whether it has a time)
BATCHES = st.lists(st.lists(st.tuples(
    st.sampled_from(["ann", "bob"]), st.integers(0, 200),
    st.one_of(st.just(0), st.just(0), st.integers(0, 600)), st.integers(0, 15).map(bool)),
    min_size=4, max_size=25), min_size=1, max_size=3)


def test_sessions_equal_sql_with_late_events_listed(spark: Any, pg: TestDatabase,
                                                    tmp_path: Path) -> None:
    dsn = pg.dsn
    store = EventStore(dsn)
    store.install()
    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(tmp_path), poll_seconds=0.05)
    clock, counter = [BASE], [0]

    def append(user: str, at: dt.datetime | None) -> None:
        counter[0] += 1
        append_visit(store, user, at, counter[0])

    @settings(max_examples=6, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(BATCHES)
    def run(batches: list[list[tuple[str, int, int, bool]]]) -> None:
        with Runner(spark, _registry(), config) as runner, Catalog(dsn) as catalog:
            for batch in batches:
                for user, step, delay, timed in batch:
                    clock[0] += dt.timedelta(seconds=step)
                    append(user, clock[0] - dt.timedelta(seconds=delay) if timed else None)
                runner.run(until_caught_up=True, timeout=120)
                check_sessions(dsn, catalog)

    try:
        run()
        # two sessions of one user, then the event between them that merges them; one
        # event without a time; one that would change a closed session
        clock[0] += dt.timedelta(hours=1)
        for minutes in (0, 6):
            append("cy", clock[0] + dt.timedelta(minutes=minutes))
        append("cy", None)
        with Runner(spark, _registry(), config) as runner, Catalog(dsn) as catalog:
            runner.run(until_caught_up=True, timeout=120)
            check_sessions(dsn, catalog)
            assert len([r for r in table(catalog, "visits") if r["user"] == "cy"]) == 2
            append("cy", clock[0] + dt.timedelta(minutes=3))
            append("ann", clock[0] - dt.timedelta(minutes=50))
            runner.run(until_caught_up=True, timeout=120)
            check_sessions(dsn, catalog)
            (merged,) = [r for r in table(catalog, "visits") if r["user"] == "cy"]
            assert merged["pages"] == 3
        with Catalog(dsn) as catalog, psycopg.connect(dsn, autocommit=True) as conn:
            letters = DeadLetters(catalog).find("visits", status="open")
            assert letters and "occurred_at is NULL" in letters[0].error
            with pytest.raises(ProjectionDefinitionError, match="merge sessions already final"):
                replay_late(conn, "visits")
            live = {n: sorted(map(repr, table(catalog, n))) for n in ("visits", "final_visits")}
            with Runner(spark, _registry(batch=5), config) as runner:
                for name in live:
                    runner.request_rebuild(name)
                runner.run(until_caught_up=True, timeout=240)
            for name in live:
                assert catalog.current(name).generation == 2
                assert sorted(map(repr, table(catalog, name))) == live[name]
    finally:
        store.close()


def test_sessions_that_cannot_work_are_refused(spark: Any, pg: TestDatabase) -> None:
    EventStore(pg.dsn).install()
    with pytest.raises(ProjectionDefinitionError, match="name the input's column"):
        session("v.occurred_at", "5 minutes", by=[])
    with pytest.raises(ProjectionDefinitionError, match="gap '0s' must be positive"):
        session("v.occurred_at", "0s", by="user")
    with pytest.raises(ProjectionDefinitionError, match="lateness '-1m' must be zero"):
        session("v.occurred_at", "1m", by="user", lateness="-1m")

    def plan(query: str, by: str = "user") -> None:
        registry = Registry()
        with registering_into(registry):
            view("s", inputs={"v": events("visit", types=["visited"])}, key=KEY, query=query,
                 target=delta_table("upsert", keys=KEY), registry=_types(),
                 window=session("v.occurred_at", "5 minutes", by=by))
        plan_views(spark, registry.views, pg.dsn)

    with pytest.raises(MissingKeyError, match="outputs window_end"):
        plan("SELECT window_start, user, count(*) AS n FROM v GROUP BY window_start, user")
    with pytest.raises(ProjectionDefinitionError, match="is by shop, which input v"):
        plan(QUERY, by="shop")
