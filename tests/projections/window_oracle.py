"""Windowed views over page-view events, and their oracle: SQL over ``lakefold.events`` that
applies lakefold's rule (an event is late for a window once the largest event time before it
in commit order, minus the allowed lateness, reached the window's end). Used by
``test_view_windows`` and the SIGKILL loop (``window_projections.py``)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import psycopg
from deltalake import DeltaTable
from pydantic import BaseModel

from lakefold.projections import (
    ProjectionOptions,
    delta_table,
    events,
    hopping,
    tumbling,
    view,
)
from lakefold.projections.operations import Catalog
from lakefold.schemas import EventRegistry

BASE = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)
MINUTE = 60_000_000
LATENESS = 2 * MINUTE


class PageViewed(BaseModel):
    page: str
    ms: int
    occurred_at: dt.datetime | None = None
    customer: int | None = None  # who viewed it (the SIGKILL loop's enriched view)


def event_types() -> EventRegistry:
    registry = EventRegistry()
    registry.add(PageViewed, name="page.viewed")
    return registry


QUERY = ("SELECT window_start, window_end, page, count(*) AS views, sum(ms) AS ms "
         "FROM views GROUP BY window_start, window_end, page")
# the same rows, not one GROUP BY of aggregates kept by their changes (``ms + 0`` is an
# expression): recomputed by Spark per touched window, where QUERY is folded from the feed
RECOMPUTED = QUERY.replace("sum(ms)", "sum(ms + 0)")
# name → (window size, slide) in microseconds
WINDOWS = {"per_minute": (MINUTE, MINUTE), "per_3_minutes": (3 * MINUTE, MINUTE),
           "final_per_minute": (MINUTE, MINUTE)}


TOTALS = ("SELECT window_start, sum(views) AS views, min(window_final) AS final "
          "FROM minutes GROUP BY window_start")


def define(names: tuple[str, ...] = tuple(WINDOWS)) -> None:
    """Register the windowed views named (into the current registry); with ``per_minute``,
    also ``minute_totals``, a view over it (corrections flow downstream)."""
    viewed = events("site", types=["page.viewed"])
    key = ["window_start", "page"]
    if "per_minute" in names:
        minutes = view("per_minute", inputs={"views": viewed}, key=key, query=QUERY,
             target=delta_table("upsert", keys=key), registry=event_types(),
             window=tumbling("views.occurred_at", "1 minute", lateness="2 minutes"))
        view("minute_totals", inputs={"minutes": minutes}, key="window_start", query=TOTALS,
             target=delta_table("upsert", keys=["window_start"]))
    if "per_3_minutes" in names:
        # fed a few events per batch: lateness and windows do not depend on the batching
        view("per_3_minutes", inputs={"views": viewed}, key=key, query=QUERY,
             target=delta_table("upsert", keys=key), registry=event_types(),
             window=hopping("views.occurred_at", "3 minutes", "1m", lateness="120s"),
             options=ProjectionOptions(max_records_per_batch=9))
    if "final_per_minute" in names:
        view("final_per_minute", inputs={"views": viewed}, key=key, query=RECOMPUTED,
             target=delta_table("upsert", keys=key), registry=event_types(),
             window=tumbling("views.occurred_at", "1 minute", lateness="2 minutes",
                             emit="final"))


def pairs_sql(size: int, slide: int) -> str:
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


def micros(moment: dt.datetime) -> int:
    return int((moment - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)).total_seconds() * 1e6)


def check(dsn: str, catalog: Catalog, name: str) -> None:
    size, slide = WINDOWS[name]
    with psycopg.connect(dsn) as conn:
        pairs = conn.execute(pairs_sql(size, slide)).fetchall()
        (top,) = conn.execute(
            "SELECT max((extract(epoch FROM (data->>'occurred_at')::timestamptz) * 1000000)"
            "::bigint) FROM lakefold.events WHERE category = 'site'").fetchone() or (None,)
        late = {(p, micros(s)): status for p, s, status in conn.execute(
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
    rows = table(catalog, name)
    got = {(micros(r["window_start"]), r["page"]): [r["views"], r["ms"]] for r in rows}
    assert got == expected
    for r in rows:
        start = micros(r["window_start"])
        assert micros(r["window_end"]) == start + size
        assert r["window_final"] == (start + size <= watermark)
    if name == "per_minute":  # the view over it sums its windows
        per_window: dict[int, int] = {}
        for (start, _), (views, _) in expected.items():
            per_window[start] = per_window.get(start, 0) + views
        assert {micros(r["window_start"]): r["views"]
                for r in table(catalog, "minute_totals")} == per_window


def table(catalog: Catalog, name: str) -> list[dict[str, Any]]:
    location = Path(catalog.current(name).location("delta"))
    if not (location / "_delta_log").exists():  # nothing written yet
        return []
    rows: list[dict[str, Any]] = DeltaTable(location).to_pyarrow_table().to_pylist()
    return rows


