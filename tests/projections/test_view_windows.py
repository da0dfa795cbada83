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
from hypothesis import HealthCheck, given, settings, strategies as st

from lakefold.capture import CaptureConfig
from lakefold.eventstore import EventStore
from lakefold.projections import DeadLetters, Runner, RunnerConfig, hopping, tumbling
from lakefold.projections.definitions._api import Registry, registering_into, view
from lakefold.projections.definitions._model import changelog, events
from lakefold.projections.definitions._target_specs import delta_table
from lakefold.projections.exceptions import MissingKeyError, ProjectionDefinitionError
from lakefold.projections.operations import Catalog, SinkRoots, projection_status
from lakefold.projections.runtime._view_validation import plan_views
from lakefold.projections.state._late_events import list_late, replay_late
from lakefold.schemas import NewEvent
from tests.projections.window_oracle import (
    BASE,
    QUERY,
    WINDOWS,
    check,
    define,
    event_types,
    table,
)

pytestmark = pytest.mark.timeout(600)


def _registry() -> Registry:
    registry = Registry()
    with registering_into(registry):
        define()
    return registry


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

    @settings(max_examples=4, deadline=None, derandomize=True,
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
                    check(dsn, catalog, name)

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
            # status counts them and shows the watermark
            (status,) = projection_status(catalog, dsn, ["per_minute"])
            assert status.late_events == len(late)
            (top,) = conn.execute("SELECT max((data->>'occurred_at')::timestamptz) "
                                  "FROM lakefold.events WHERE category = 'site'").fetchone() \
                or (None,)
            assert status.watermark is not None
            assert dt.datetime.fromisoformat(status.watermark) == top - dt.timedelta(minutes=2)
            # replaying the late events of one view folds them into their windows
            before = {n: _view_rows(catalog, n) for n in WINDOWS}
            assert replay_late(conn, "per_minute") == len(late)
            assert replay_late(conn, "per_minute") == 0
            with Runner(spark, _registry(), config) as runner:
                runner.run(until_caught_up=True, timeout=120)
            for name in WINDOWS:
                check(dsn, catalog, name)
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


def _view_rows(catalog: Catalog, name: str) -> list[tuple[Any, ...]]:
    rows = table(catalog, name)
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
                "upsert", keys=on), registry=event_types(), window=window)
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
    with pytest.raises(ProjectionDefinitionError, match="has no column 'created_at'"):
        check(tumbling("customers.created_at", "1m"), query="SELECT * FROM customers",
              inputs={"customers": changelog("public.customers")})
    with pytest.raises(ProjectionDefinitionError, match="window the upstream view's inputs"):
        check(tumbling("up.occurred_at", "1m"), query="SELECT * FROM up",
              inputs={"up": "per_minute"})
    with pytest.raises(MissingKeyError, match="key holds window_start"):
        check(tumbling("views.occurred_at", "1m"), on=["page"])
    with pytest.raises(ProjectionDefinitionError, match="outputs window_final"):
        check(tumbling("views.occurred_at", "1m"),
              query="SELECT window_start, page, true AS window_final FROM views "
                    "GROUP BY window_start, page")
    check(tumbling("views.occurred_at", "1m"))  # the same view, windowed right, passes


def test_a_deleted_stream_leaves_its_windows(spark: Any, shop: CaptureConfig,
                                             tmp_path: Path) -> None:
    """A stream's deletion (soft or hard) takes its events out of their windows, final ones
    too, in the view folded from its feed (``per_minute``) as in the one Spark recomputes
    (``final_per_minute``); a stream appended and deleted within one batch never counts; a
    batch of a deletion alone empties windows too."""
    dsn = shop.source_dsn
    registry = Registry()
    with registering_into(registry):
        define(("per_minute", "final_per_minute"))
    config = RunnerConfig(store_dsn=dsn, roots=SinkRoots.under(tmp_path), poll_seconds=0.05)
    plans = plan_views(spark, registry.views, dsn)
    assert plans["per_minute"].plan.aggregate is not None  # folded from its feed
    assert plans["final_per_minute"].plan.aggregate is None  # recomputed by Spark
    kept: list[tuple[str, int, int]] = []  # (stream, minute, ms) of the events that count
    top = [0]  # the largest minute appended

    def append(stream: str, minute: int, ms: int, *, count: bool = True) -> None:
        moment = BASE + dt.timedelta(minutes=minute, seconds=7)
        store.append(stream, [NewEvent(type="page.viewed", data={
            "page": "/", "ms": ms, "occurred_at": moment.isoformat()})])
        kept.append((stream, minute, ms))
        top[0] = max(top[0], minute)

    def expected(final: bool) -> dict[tuple[dt.datetime, str], tuple[int, int]]:
        out: dict[tuple[dt.datetime, str], tuple[int, int]] = {}
        for _, minute, ms in kept:
            if final and minute + 1 > top[0] - 2:  # its end is after the watermark
                continue
            views, total = out.get((BASE + dt.timedelta(minutes=minute), "/"), (0, 0))
            out[(BASE + dt.timedelta(minutes=minute), "/")] = (views + 1, total + ms)
        return out

    def rows(catalog: Catalog, name: str) -> dict[tuple[dt.datetime, str], tuple[int, int]]:
        return {(r["window_start"], r["page"]): (r["views"], r["ms"])
                for r in table(catalog, name)}

    with EventStore(dsn) as store, Catalog(dsn) as catalog:
        store.install()
        for stream, minute, ms in [("site-a", 0, 1), ("site-a", 1, 2), ("site-b", 1, 4),
                                   ("site-b", 5, 8), ("site-c", 5, 16), ("site-a", 5, 32)]:
            append(stream, minute, ms)
        with Runner(spark, registry, config) as runner:
            runner.run(until_caught_up=True, timeout=120)
            assert rows(catalog, "per_minute") == expected(False)
            assert rows(catalog, "final_per_minute") == expected(True)
            assert expected(True)  # windows 0 and 1 are final: the deletions correct them
            store.delete_stream("site-a")
            store.delete_stream("site-b", hard=True)
            append("site-d", 1, 64)
            store.delete_stream("site-d")
            kept[:] = [k for k in kept if k[0] == "site-c"]
            append("site-c", 6, 128)
            runner.run(until_caught_up=True, timeout=120)
            assert rows(catalog, "per_minute") == expected(False)
            assert rows(catalog, "final_per_minute") == expected(True)
            store.delete_stream("site-c")  # a batch of a deletion alone
            kept.clear()
            runner.run(until_caught_up=True, timeout=120)
            assert rows(catalog, "per_minute") == rows(catalog, "final_per_minute") == {}
