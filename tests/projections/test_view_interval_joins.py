"""Stream-stream joins within a time bound: searches joined to the clicks of their session
within the bound, inner and left outer, with event times out of order and late. After every
batch each view equals a SQL self-join of ``lakefold.events`` with the same bound over the
events that were not late (the left outer one: its left events whose bound passed, with the
unmatched ones once), every event is joined or listed late (never both), the views' state
holds exactly the events that can still join, and a rebuild gives the live rows. Joins that
would keep every event are refused naming the missing bound."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from pydantic import BaseModel

from lakefold.eventstore import EventStore
from lakefold.projections import (
    DeadLetters,
    Runner,
    RunnerConfig,
    interval_join,
    tumbling,
)
from lakefold.projections.definitions._api import Registry, registering_into, view
from lakefold.projections.definitions._model import changelog, events
from lakefold.projections.definitions._target_specs import delta_table
from lakefold.projections.exceptions import (
    MissingKeyError,
    NotMaintainableError,
    ProjectionDefinitionError,
)
from lakefold.projections.operations import Catalog, SinkRoots, projection_status
from lakefold.projections.operators._view_core import view_owner
from lakefold.projections.operators._view_events import feed_stream
from lakefold.projections.runtime._view_validation import plan_views
from lakefold.projections.state._late_events import replay_late
from lakefold.projections.state._stream_state import LatestRows
from lakefold.schemas import EventRegistry, NewEvent
from tests.fixtures.postgres import TestDatabase
from tests.projections.window_oracle import table

pytestmark = pytest.mark.timeout(600)

BASE = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)
SECOND = 1_000_000
LATENESS = 60 * SECOND


class Searched(BaseModel):
    session: str
    query: str
    occurred_at: dt.datetime | None = None


class Clicked(BaseModel):
    session: str
    item: str
    occurred_at: dt.datetime | None = None


def _types() -> EventRegistry:
    registry = EventRegistry()
    registry.add(Searched, name="searched")
    registry.add(Clicked, name="clicked")
    return registry


# name → (lower, upper) of click time - search time, in microseconds, and the query
VIEWS = {
    "search_clicks": (0, 300 * SECOND, True,
                      "SELECT s.position AS search, coalesce(c.position, 0) AS click, "
                      "s.session, s.query, c.item FROM s LEFT JOIN c ON c.session = s.session "
                      "AND c.occurred_at BETWEEN s.occurred_at AND s.occurred_at + INTERVAL "
                      "5 MINUTES"),
    "search_clicks_inner": (-60 * SECOND, 180 * SECOND, False,
                            "SELECT s.position AS search, c.position AS click, s.session, "
                            "c.item FROM s JOIN c ON c.session = s.session "
                            "AND c.occurred_at >= s.occurred_at - INTERVAL 1 MINUTE "
                            "AND c.occurred_at <= s.occurred_at + INTERVAL '3' MINUTE"),
}


def _inputs() -> dict[str, Any]:
    return {"s": events("web", types=["searched"]), "c": events("web", types=["clicked"])}


def define_joins(batch: int | None = None) -> None:
    """Register the joined views (into the current registry; also the SIGKILL loop's)."""
    from lakefold.projections import ProjectionOptions

    options = ProjectionOptions(max_records_per_batch=batch) if batch else None
    for name, (_, _, _, query) in VIEWS.items():
        view(name, inputs=_inputs(), key=["search", "click"], query=query,
             target=delta_table("upsert", keys=["search", "click"]), registry=_types(),
             join=interval_join(left="s.occurred_at", right="c.occurred_at",
                                lateness="1 minute"), options=options)


def _registry(batch: int | None = None) -> Registry:
    registry = Registry()
    with registering_into(registry):
        define_joins(batch)
    return registry


def append_web(store: EventStore, search: bool, session: str, at: dt.datetime | None,
               value: str) -> None:
    """Append a search (or a click) of ``session`` at ``at`` (None: without a time)."""
    data: dict[str, Any] = {"session": session, "query" if search else "item": value}
    if at is not None:
        data["occurred_at"] = at.isoformat()
    store.append(f"web-{session}", [NewEvent(type="searched" if search else "clicked",
                                             data=data)])


def _events(dsn: str) -> list[tuple[int, str, str, str, int | None]]:
    """(position, type, session, query or item, time) of the web events, in commit order."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT p.first_position + e.ordinal, e.type, e.data->>'session', "
            "coalesce(e.data->>'query', e.data->>'item'), (extract(epoch FROM "
            "(e.data->>'occurred_at')::timestamptz) * 1000000)::bigint "
            "FROM lakefold.events e JOIN lakefold.event_positions p USING (xid) "
            "WHERE e.category = 'web' ORDER BY 1").fetchall()
    return [(int(p), t, s, v, None if at is None else int(at)) for p, t, s, v, at in rows]


def _expected(dsn: str, name: str) -> tuple[set[tuple[Any, ...]], set[int], int | None,
                                             set[int], set[int]]:
    """What SQL says the view holds: its rows, the late positions, the watermark, and the
    left and right events its state still keeps."""
    lower, upper, outer, _ = VIEWS[name]
    top: int | None = None
    late, kept = set(), []
    for position, kind, session, value, at in _events(dsn):
        if at is None:
            continue
        top = at if top is None else max(top, at)
        reach = at + upper if kind == "searched" else at
        if reach < top - LATENESS:
            late.add(position)
        else:
            kept.append((position, kind, session, value, at))
    watermark = None if top is None else top - LATENESS
    with psycopg.connect(dsn) as conn:  # the bound as SQL over the events joined
        conn.execute("CREATE TEMP TABLE joined (position bigint, kind text, session text, "
                     "value text, at bigint)")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO joined VALUES (%s, %s, %s, %s, %s)", kept)
        pairs = conn.execute(
            "SELECT s.position, c.position, s.session, s.value, c.value, s.at "
            "FROM joined s LEFT JOIN joined c ON c.kind = 'clicked' AND c.session = s.session "
            "AND c.at - s.at BETWEEN %s AND %s WHERE s.kind = 'searched'",
            (lower, upper)).fetchall()
    floor = -2**62 if watermark is None else watermark
    rows: set[tuple[Any, ...]] = set()
    for search, click, session, query, item, at in pairs:
        if outer and at + upper < floor:
            rows.add((search, click or 0, session, query, item))
        elif not outer and click is not None:
            rows.add((search, click, session, item))
    left = {p for p, k, _, _, at in kept if k == "searched" and at + upper >= floor}
    right = {p for p, k, _, _, at in kept if k == "clicked" and at - lower + upper >= floor}
    return rows, late, watermark, left, right


def check_join(dsn: str, catalog: Catalog, name: str) -> None:
    """The view equals SQL, its late events are listed, its state keeps what can join."""
    rows, late, _, left, right = _expected(dsn, name)
    got = table(catalog, name)
    found: set[tuple[Any, ...]]
    if name == "search_clicks":
        found = {(r["search"], r["click"], r["session"], r["query"], r["item"]) for r in got}
    else:
        found = {(r["search"], r["click"], r["session"], r["item"]) for r in got}
    assert found == rows
    with psycopg.connect(dsn) as conn:
        listed = conn.execute("SELECT position, kind FROM lakefold.late_events "
                              "WHERE view = %s", (name,)).fetchall()
        assert {p for p, _ in listed} == late and all(k == "join" for _, k in listed)
        generation = catalog.current(name).generation
        owner = view_owner(name, generation)
        for alias, wanted in (("s", left), ("c", right)):
            state = LatestRows(owner, feed_stream(name, generation, alias))
            kept = set(state.rows(conn).column("_position").to_pylist())
            stream_positions = conn.execute(
                "SELECT c.position, (c.after[1])::bigint FROM lakefold.changelog c "
                "JOIN lakefold.changelog_streams s ON s.stream_id = c.stream_id "
                "WHERE s.name = %s", (feed_stream(name, generation, alias),)).fetchall()
            event_of: dict[int, int] = dict(stream_positions)
            assert {event_of[p] for p in kept} == wanted, (name, alias)


# a batch: events as (search?, session, seconds after the previous event's base time, delay
# in seconds behind it, whether it has a time)
BATCHES = st.lists(st.lists(st.tuples(
    st.booleans(), st.sampled_from(["a", "b", "c"]), st.integers(0, 40),
    st.one_of(st.just(0), st.just(0), st.integers(0, 300)), st.integers(0, 15).map(bool)),
    min_size=4, max_size=30), min_size=1, max_size=3)


def test_interval_joins_equal_sql_with_bounded_state(spark: Any, pg: TestDatabase,
                                                     tmp_path: Path) -> None:
    dsn = pg.dsn
    store = EventStore(dsn)
    store.install()
    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(tmp_path), poll_seconds=0.05)
    clock, counter = [BASE], [0]

    @settings(max_examples=6, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(BATCHES)
    def run(batches: list[list[tuple[bool, str, int, int, bool]]]) -> None:
        with Runner(spark, _registry(), config) as runner, Catalog(dsn) as catalog:
            for batch in batches:
                for search, session, step, delay, timed in batch:
                    clock[0] += dt.timedelta(seconds=step)
                    counter[0] += 1
                    append_web(store, search, session, clock[0] - dt.timedelta(
                        seconds=delay) if timed else None, f"v{counter[0]}")
                runner.run(until_caught_up=True, timeout=120)
                for name in VIEWS:
                    check_join(dsn, catalog, name)

    try:
        run()
        # a search and its click, one event without a time, one far behind the watermark
        clock[0] += dt.timedelta(minutes=10)
        at = clock[0].isoformat()
        store.append("web-z", [
            NewEvent(type="searched", data={"session": "z", "query": "q", "occurred_at": at}),
            NewEvent(type="clicked", data={"session": "z", "item": "i", "occurred_at": at}),
            NewEvent(type="clicked", data={"session": "z", "item": "no time"}),
            NewEvent(type="clicked", data={"session": "z", "item": "late", "occurred_at": (
                clock[0] - dt.timedelta(hours=1)).isoformat()}),
            NewEvent(type="searched", data={"session": "y", "query": "q", "occurred_at": (
                clock[0] + dt.timedelta(minutes=20)).isoformat()})])
        with Runner(spark, _registry(), config) as runner, Catalog(dsn) as catalog:
            runner.run(until_caught_up=True, timeout=120)
            for name in VIEWS:
                check_join(dsn, catalog, name)
                assert table(catalog, name) and _expected(dsn, name)[1]
        with Catalog(dsn) as catalog, psycopg.connect(dsn, autocommit=True) as conn:
            # events without a time are dead letters of each view, saying why
            (untimed,) = conn.execute(
                "SELECT count(*) FROM lakefold.events WHERE category = 'web' "
                "AND data->>'occurred_at' IS NULL").fetchone() or (0,)
            letters = DeadLetters(catalog).find("search_clicks", status="open")
            assert len(letters) == untimed > 0
            assert "occurred_at is NULL; it is in no window or join" in letters[0].error
            # status counts the late events and shows the watermark
            (status,) = projection_status(catalog, dsn, ["search_clicks"])
            _, late, watermark, _, _ = _expected(dsn, "search_clicks")
            assert status.late_events == len(late) > 0 and watermark is not None
            assert status.watermark == (BASE.replace(year=1970, month=1, day=1, hour=0, minute=0)
                                        + dt.timedelta(microseconds=watermark)).isoformat()
            # late events of a join cannot be replayed: their partners may be gone
            with pytest.raises(ProjectionDefinitionError, match="larger allowed lateness"):
                replay_late(conn, "search_clicks")
            # a rebuild, fed a few events per batch, joins the same pairs
            live = {n: sorted(map(repr, table(catalog, n))) for n in VIEWS}
            with Runner(spark, _registry(batch=7), config) as runner:
                for name in VIEWS:
                    runner.request_rebuild(name)
                runner.run(until_caught_up=True, timeout=240)
            for name in VIEWS:
                assert catalog.current(name).generation == 2
                assert sorted(map(repr, table(catalog, name))) == live[name]
    finally:
        store.close()


def _plan(spark: Any, dsn: str, **kwargs: Any) -> None:
    registry = Registry()
    key = kwargs.pop("key", ["search", "click"])
    with registering_into(registry):
        view("joined", inputs=_inputs(), key=key, target=delta_table("upsert", keys=key),
             registry=_types(), **kwargs)
    plan_views(spark, registry.views, dsn)


def test_unbounded_and_unmaintainable_joins_are_refused(spark: Any, pg: TestDatabase) -> None:
    EventStore(pg.dsn).install()
    join = interval_join(left="s.occurred_at", right="c.occurred_at")
    pairs = "SELECT s.position AS search, c.position AS click FROM s JOIN c " \
        "ON c.session = s.session"
    with pytest.raises(NotMaintainableError, match="has no upper bound"):
        _plan(spark, pg.dsn, join=join, query=pairs + " AND c.occurred_at >= s.occurred_at")
    with pytest.raises(NotMaintainableError, match="has no lower bound"):
        _plan(spark, pg.dsn, join=join,
              query=pairs + " AND c.occurred_at < s.occurred_at + INTERVAL 1 HOUR")
    with pytest.raises(NotMaintainableError, match="has no lower or upper bound"):
        _plan(spark, pg.dsn, join=join, query=pairs)
    with pytest.raises(NotMaintainableError, match="bound is empty"):
        _plan(spark, pg.dsn, join=join, query=pairs + " AND c.occurred_at BETWEEN "
              "s.occurred_at + INTERVAL 2 MINUTES AND s.occurred_at + INTERVAL 1 MINUTE")
    bounded = pairs + " AND c.occurred_at BETWEEN s.occurred_at AND s.occurred_at + " \
        "INTERVAL 1 MINUTE"
    with pytest.raises(MissingKeyError, match="key starts with the left input's position"):
        _plan(spark, pg.dsn, join=join, key=["click", "search"], query=bounded)
    with pytest.raises(ProjectionDefinitionError, match="which is not a time"):
        _plan(spark, pg.dsn, query=bounded,
              join=interval_join(left="s.stream_version", right="c.occurred_at"))
    with pytest.raises(ProjectionDefinitionError, match="window or an interval join"):
        _plan(spark, pg.dsn, join=join, query=bounded,
              window=tumbling("s.occurred_at", "1 minute"))
    with pytest.raises(ProjectionDefinitionError, match="is over input c, a changelog"):
        view("x", inputs={"s": events("web"), "c": changelog("public.t")}, key="search",
             target=delta_table("upsert", keys=["search"]), query=bounded, join=join)
    with pytest.raises(ProjectionDefinitionError, match="both input 's'"):
        interval_join(left="s.occurred_at", right="s.at")
    with pytest.raises(ProjectionDefinitionError, match="is not a duration"):
        interval_join(left="s.occurred_at", right="c.occurred_at", lateness="soon")
    with pytest.raises(ProjectionDefinitionError, match="must be zero or positive"):
        interval_join(left="s.occurred_at", right="c.occurred_at", lateness="-1 minute")
