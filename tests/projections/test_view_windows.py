"""Windows over event time: a tumbling and a hopping window view over page-view events, with
event times out of order and late, kept equal after every batch to SQL over
``lakefold.events`` that applies the same rule (an event is late for a window once the largest
event time before it in commit order, minus the allowed lateness, reached the window's end).
Every (event, window) pair is counted in its window or listed as late, never both, never
neither; events without a time go to the dead letters; a replay folds late events back in; a
rebuild gives the live run's rows. Windows that cannot work are refused at registration."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from lakefold.capture import CaptureConfig
from lakefold.eventstore import EventStore
from lakefold.projections import DeadLetters, Runner, RunnerConfig, hopping, tumbling
from lakefold.projections._api import Registry, registering_into, view
from lakefold.projections._late_events import list_late, replay_late
from lakefold.projections._model import changelog, events
from lakefold.projections._target_specs import delta_table
from lakefold.projections._view_validation import plan_views
from lakefold.projections.exceptions import MissingKeyError, ProjectionDefinitionError
from lakefold.projections.operations import Catalog, SinkRoots
from lakefold.schemas import EventRegistry, NewEvent

pytestmark = pytest.mark.timeout(600)

BASE = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)
MINUTE = 60_000_000
LATENESS = 2 * MINUTE


class PageViewed(BaseModel):
    page: str
    ms: int
    occurred_at: dt.datetime | None = None


def _types() -> EventRegistry:
    registry = EventRegistry()
    registry.add(PageViewed, name="page.viewed")
    return registry


QUERY = ("SELECT window_start, window_end, page, count(*) AS views, sum(ms) AS ms "
         "FROM views GROUP BY window_start, window_end, page")
# name → (window size, slide) in microseconds
WINDOWS = {"per_minute": (MINUTE, MINUTE), "per_3_minutes": (3 * MINUTE, MINUTE),
           "final_per_minute": (MINUTE, MINUTE)}


def _registry() -> Registry:
    registry = Registry()
    viewed = events("site", types=["page.viewed"])
    key = ["window_start", "page"]
    with registering_into(registry):
        view("per_minute", inputs={"views": viewed}, key=key, query=QUERY,
             target=delta_table("upsert", keys=key), registry=_types(),
             window=tumbling("views.occurred_at", "1 minute", lateness="2 minutes"))
        view("per_3_minutes", inputs={"views": viewed}, key=key, query=QUERY,
             target=delta_table("upsert", keys=key), registry=_types(),
             window=hopping("views.occurred_at", "3 minutes", "1m", lateness="120s"))
        view("final_per_minute", inputs={"views": viewed}, key=key, query=QUERY,
             target=delta_table("upsert", keys=key), registry=_types(),
             window=tumbling("views.occurred_at", "1 minute", lateness="2 minutes",
                             emit="final"))
    return registry


def _pairs_sql(size: int, slide: int) -> str:
    """Every (event, window) pair with the watermark before the event, in SQL."""
    return f"""
        WITH e AS (
            SELECT p.first_position + e.ordinal AS position, data->>'page' AS page,
                   (data->>'ms')::bigint AS ms,
                   (extract(epoch FROM (data->>'occurred_at')::timestamptz) * 1000000)::bigint
                       AS t
            FROM lakefold.events e JOIN lakefold.event_positions p USING (xid)
            WHERE category = 'site' AND type = 'page.viewed'),
        r AS (SELECT *, max(t) OVER (ORDER BY position) AS top FROM e WHERE t IS NOT NULL)
        SELECT r.position, r.page, r.ms, w.start, r.top - {LATENESS} AS watermark
        FROM r CROSS JOIN LATERAL (
            SELECT (floor(r.t::numeric / {slide}))::bigint * {slide} - b * {slide} AS start
            FROM generate_series(0, {size // slide - 1}) b) w
        WHERE w.start + {size} > r.t"""


def _micros(moment: dt.datetime) -> int:
    return int((moment - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)).total_seconds() * 1e6)


def _check(dsn: str, catalog: Catalog, name: str) -> None:
    size, slide = WINDOWS[name]
    with psycopg.connect(dsn) as conn:
        pairs = conn.execute(_pairs_sql(size, slide)).fetchall()
        (top,) = conn.execute(
            "SELECT max((extract(epoch FROM (data->>'occurred_at')::timestamptz) * 1000000)"
            "::bigint) FROM lakefold.events WHERE category = 'site'").fetchone() or (None,)
        late = {(p, _micros(s)): status for p, s, status in conn.execute(
            "SELECT position, window_start, status FROM lakefold.late_events "
            "WHERE view = %s", (name,))}
    watermark = -2**62 if top is None else top - LATENESS
    expected: dict[tuple[int, str], list[int]] = {}
    on_time = set()
    for position, page, ms, start, before in pairs:
        closed = start + size <= before
        if closed and late.get((position, start)) != "replayed":
            assert late.get((position, start)) == "late", (position, start)
            continue
        if not closed:
            assert (position, start) not in late, (position, start)
        on_time.add((position, start))
        totals = expected.setdefault((start, page), [0, 0])
        totals[0] += 1
        totals[1] += ms
    assert set(late) <= {(p, s) for p, _, _, s, _ in pairs}  # nothing else is late
    if name.startswith("final"):
        expected = {k: v for k, v in expected.items() if k[0] + size <= watermark}
    rows = _table(catalog, name)
    got = {(_micros(r["window_start"]), r["page"]): [r["views"], r["ms"]] for r in rows}
    assert got == expected
    for r in rows:
        start = _micros(r["window_start"])
        assert _micros(r["window_end"]) == start + size
        assert r["window_final"] == (start + size <= watermark)


# a batch: events as (page, seconds after the previous event's base time, delay in seconds
# behind it, whether it has a time)
BATCHES = st.lists(st.lists(st.tuples(
    st.sampled_from(["/", "/cart", "/pay"]), st.integers(0, 50),
    st.one_of(st.just(0), st.just(0), st.integers(0, 400)), st.integers(0, 12).map(bool)),
    min_size=1, max_size=25), min_size=1, max_size=3)


def test_windows_equal_sql_with_late_events_listed_and_replayed(
        spark: Any, shop: CaptureConfig, tmp_path: Path) -> None:
    dsn = shop.source_dsn
    store = EventStore(dsn)
    store.install()
    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(tmp_path), poll_seconds=0.05)
    clock = [BASE]
    counter = [0]

    @settings(max_examples=6, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(BATCHES)
    def run(batches: list[list[tuple[str, int, int, bool]]]) -> None:
        with Runner(spark, _registry(), config) as runner, Catalog(dsn) as catalog:
            for batch in batches:
                for page, step, delay, timed in batch:
                    clock[0] += dt.timedelta(seconds=step)
                    data: dict[str, Any] = {"page": page, "ms": step * 7 + delay}
                    if timed:
                        data["occurred_at"] = (clock[0] - dt.timedelta(seconds=delay)
                                               ).isoformat()
                    store.append(f"site-{counter[0] % 5}", [NewEvent(
                        type="page.viewed", data=data)])
                    counter[0] += 1
                runner.run(until_caught_up=True, timeout=120)
                for name in WINDOWS:
                    _check(dsn, catalog, name)

    try:
        run()
        # one event without a time, one far behind every window still open
        store.append("site-x", [
            NewEvent(type="page.viewed", data={"page": "/", "ms": 1}),
            NewEvent(type="page.viewed", data={"page": "/", "ms": 2, "occurred_at": (
                clock[0] - dt.timedelta(hours=1)).isoformat()})])
        with Runner(spark, _registry(), config) as runner:
            runner.run(until_caught_up=True, timeout=120)
        with Catalog(dsn) as catalog, psycopg.connect(dsn, autocommit=True) as conn:
            # an event without a time is a dead letter of each view, saying why
            (untimed,) = conn.execute(
                "SELECT count(*) FROM lakefold.events WHERE category = 'site' "
                "AND data->>'occurred_at' IS NULL").fetchone() or (0,)
            letters = DeadLetters(catalog).find("per_minute", status="open")
            assert len(letters) == untimed > 0
            assert "occurred_at is NULL; it is in no window" in letters[0].error
            late = list_late(conn, "per_minute", limit=10_000)
            assert late and all(e.late_by_seconds >= 0 for e in late)
            # replaying the late events of one view folds them into their windows
            before = {n: _view_rows(catalog, n) for n in WINDOWS}
            assert replay_late(conn, "per_minute") == len(late)
            assert replay_late(conn, "per_minute") == 0
            with Runner(spark, _registry(), config) as runner:
                runner.run(until_caught_up=True, timeout=120)
            for name in WINDOWS:
                _check(dsn, catalog, name)
            assert _view_rows(catalog, "per_3_minutes") == before["per_3_minutes"]
            assert _view_rows(catalog, "per_minute") != before["per_minute"]
            # a rebuild classifies every event as the live run did, however it is batched,
            # and counts the replayed ones
            live = {n: _view_rows(catalog, n) for n in WINDOWS}
            with Runner(spark, _registry(), config) as runner:
                for name in WINDOWS:
                    runner.request_rebuild(name)
                runner.run(until_caught_up=True, timeout=180)
            for name in WINDOWS:
                assert catalog.current(name).generation == 2
                assert _view_rows(catalog, name) == live[name]
    finally:
        store.close()


def _table(catalog: Catalog, name: str) -> list[dict[str, Any]]:
    location = Path(catalog.current(name).location("delta"))
    if not (location / "_delta_log").exists():  # nothing written yet
        return []
    rows: list[dict[str, Any]] = DeltaTable(location).to_pyarrow_table().to_pylist()
    return rows


def _view_rows(catalog: Catalog, name: str) -> list[tuple[Any, ...]]:
    rows = _table(catalog, name)
    return sorted((r["window_start"], r["page"], r["views"], r["ms"], r["window_final"])
                  for r in rows)


def test_windows_that_cannot_work_are_refused(spark: Any, shop: CaptureConfig) -> None:
    viewed = {"views": events("site", types=["page.viewed"])}
    key = ["window_start", "page"]

    def check(window: Any, *, query: str = QUERY, inputs: Any = viewed,
              on: list[str] = key) -> None:
        views = Registry()
        with registering_into(views):
            view("v", inputs=inputs, key=on, query=query, target=delta_table(
                "upsert", keys=on), registry=_types(), window=window)
        plan_views(spark, views.views, shop.source_dsn)

    for size in ("0s", "-1 minute", "soon", 60):
        with pytest.raises(ProjectionDefinitionError, match="window size"):
            check(tumbling("views.occurred_at", size))  # type: ignore[arg-type]
    with pytest.raises(ProjectionDefinitionError, match="allowed lateness '-5s' must be"):
        check(tumbling("views.occurred_at", "1m", lateness="-5s"))
    with pytest.raises(ProjectionDefinitionError, match="not a whole number of slides"):
        check(hopping("views.occurred_at", "5m", "2m"))
    with pytest.raises(ProjectionDefinitionError, match=r"'input\.column'"):
        check(tumbling("occurred_at", "1m"))
    with pytest.raises(ProjectionDefinitionError, match="of type int64, which is not a time"):
        check(tumbling("views.ms", "1m"))
    with pytest.raises(ProjectionDefinitionError, match="has no column 'at'"):
        check(tumbling("views.at", "1m"))
    with pytest.raises(ProjectionDefinitionError, match="no input 'clicks'"):
        check(tumbling("clicks.occurred_at", "1m"))
    with pytest.raises(ProjectionDefinitionError, match="windows are over event inputs"):
        check(tumbling("customers.created_at", "1m"), query="SELECT * FROM customers",
              inputs={"customers": changelog("public.customers")})
    with pytest.raises(MissingKeyError, match="key holds window_start"):
        check(tumbling("views.occurred_at", "1m"), on=["page"])
    with pytest.raises(ProjectionDefinitionError, match="outputs window_final"):
        check(tumbling("views.occurred_at", "1m"),
              query="SELECT window_start, page, true AS window_final FROM views "
                    "GROUP BY window_start, page")
    check(tumbling("views.occurred_at", "1m"))  # the same view, windowed right, passes
