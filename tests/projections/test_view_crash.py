"""SIGKILL loops over views: a runner keeping order_lines and revenue_by_city (a view over
order_lines) is killed at random moments in either stage while the source keeps changing;
afterwards both Delta tables equal the same SQL on the source, row for row. The same for a
windowed view with late events and a view over it (every event is counted in its window or
listed late, exactly once), an interval join and session windows (equal to SQL, late events
listed, the join's state holding exactly what can still join)."""

from __future__ import annotations

import datetime as dt
import os
import random
import signal
import subprocess
import sys
import time
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from lakefold.capture import CaptureConfig
from lakefold.eventstore import EventStore
from lakefold.projections.operations import Catalog
from lakefold.schemas import NewEvent
from tests.capture.conftest import capture_now
from tests.projections.test_view_interval_joins import VIEWS as JOINS, append_web, check_join
from tests.projections.test_view_sessions import append_visit, check_sessions
from tests.projections.view_shop import change_shop, oracle
from tests.projections.window_oracle import BASE, check

pytestmark = pytest.mark.timeout(900)
KILLS = 6


def _start(dsn: str, home: str, mode: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.projections.kill_child", "view_projections.py", dsn,
         "redis://unused", home, mode],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)


def _heads(dsn: str, views: tuple[str, ...] = ("order_lines", "revenue_by_city")
           ) -> tuple[int, ...]:
    """How far each view's output stream is (what the child has committed)."""
    with psycopg.connect(dsn) as conn:
        rows: dict[str, int] = dict(conn.execute(
            "SELECT name, head FROM lakefold.changelog_streams WHERE name LIKE "
            "'lakefold_views.%'").fetchall())
    return tuple(int(rows.get(f"lakefold_views.{view}_g1", 0)) for view in views)


def _wait_for_progress(dsn: str, before: tuple[int, ...], timeout: float,
                       views: tuple[str, ...] = ("order_lines", "revenue_by_city")) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(now > then for now, then in zip(_heads(dsn, views), before, strict=True)):
            return True
        time.sleep(0.1)
    return False


def _table(catalog: Catalog, name: str, key: str) -> dict[Any, dict[str, Any]]:
    try:
        rows = DeltaTable(catalog.current(name).location("delta")).to_pyarrow_table()
    except Exception:  # not written yet
        return {}
    return {row[key]: row for row in rows.to_pylist()}


def test_sigkill_loop_over_a_chain_of_views(shop: CaptureConfig, tmp_path: Any) -> None:
    dsn, home = shop.source_dsn, str(tmp_path)
    rng = random.Random(5)
    catalog = Catalog(dsn)
    started = time.monotonic()
    busy = 0
    for kill in range(KILLS):
        child = _start(dsn, home, "run")
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"started"
        # changes, then wait until both stages committed some (the child is at work), then
        # more changes and the kill at a random moment in either stage
        before = _heads(dsn)
        change_shop(dsn, rng, 2 * kill)
        capture_now(shop)
        busy += _wait_for_progress(dsn, before, timeout=60)
        change_shop(dsn, rng, 2 * kill + 1)
        capture_now(shop)
        time.sleep(rng.uniform(0.0, 1.0))
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
        print(f"kill {kill}: {time.monotonic() - started:.1f} s, heads {_heads(dsn)}",
              flush=True)
    assert busy >= KILLS // 2, "the children rarely committed: the kills proved little"
    child = _start(dsn, home, "finish")
    out, _ = child.communicate(timeout=300)
    assert child.returncode == 0 and b"caught up" in out
    lines = _table(catalog, "order_lines", "order_id")
    assert lines == {k[0]: row for k, row in oracle(dsn, "order_lines").items()}
    by_city = _table(catalog, "revenue_by_city", "city")
    for row in by_city.values():
        row["average"] = row["average"].quantize(Decimal("0.000001"))
    assert by_city == {k[0]: row for k, row in oracle(dsn, "revenue_by_city").items()}
    catalog.close()


WINDOW_KILLS = 3


def _append_views(dsn: str, store: EventStore, rng: random.Random, clock: list[dt.datetime],
                  count: int, cities: dict[str, str | None]) -> None:
    """Page views, a few out of order, some later than the allowed lateness, some untimed;
    each by a customer who may just have moved (``cities``: event id → the city then)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(count):
            if rng.random() < 0.2:
                conn.execute("UPDATE customers SET city = %s WHERE id = %s",
                             (rng.choice(("Oslo", "Lima", "Pune", "Rome")), rng.randrange(1, 7)))
            clock[0] += dt.timedelta(seconds=rng.randrange(0, 40))
            delay = rng.choice((0, 0, 0, rng.randrange(0, 60), rng.randrange(100, 600)))
            customer = rng.randrange(1, 8)  # customer 7 does not exist: no city
            data: dict[str, Any] = {"page": rng.choice(("/", "/cart")),
                                    "ms": rng.randrange(99), "customer": customer}
            if rng.random() > 0.05:
                data["occurred_at"] = (clock[0] - dt.timedelta(seconds=delay)).isoformat()
            found = conn.execute("SELECT city FROM customers WHERE id = %s",
                                 (customer,)).fetchone()
            result = store.append(f"site-{rng.randrange(4)}", [NewEvent(
                type="page.viewed", data=data)])
            cities[str(result.events[0].event_id)] = None if found is None else found[0]


def _append_web_and_visits(store: EventStore, rng: random.Random, clock: list[dt.datetime],
                           count: int) -> None:
    """Searches and clicks, and visits, a few out of order or late, some untimed."""
    for i in range(count):
        at = clock[0] - dt.timedelta(seconds=rng.choice((0, 0, rng.randrange(0, 90),
                                                          rng.randrange(100, 900))))
        timed = rng.random() > 0.05
        append_web(store, rng.random() < 0.5, rng.choice("ab"), at if timed else None, f"w{i}")
        append_visit(store, rng.choice(("ann", "bob")), at if timed else None, i)


WINDOW_VIEWS = ("per_minute", "minute_totals", "views_with_city", *JOINS, "visits",
                "final_visits")


def test_sigkill_loop_over_windowed_views_with_late_events(shop: CaptureConfig,
                                                           tmp_path: Any) -> None:
    dsn, home = shop.source_dsn, str(tmp_path)
    rng = random.Random(11)
    store = EventStore(dsn)
    store.install()
    store.record_commit_order()  # every view is enriched as of its commit
    clock = [BASE]
    cities: dict[str, str | None] = {}
    busy = 0
    try:
        for _ in range(WINDOW_KILLS):
            child = subprocess.Popen(
                [sys.executable, "-m", "tests.projections.kill_child", "window_projections.py",
                 dsn, "redis://unused", home, "run"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
            assert child.stdout is not None
            assert child.stdout.readline().strip() == b"started"
            before = _heads(dsn, WINDOW_VIEWS)
            _append_views(dsn, store, rng, clock, 30, cities)
            _append_web_and_visits(store, rng, clock, 20)
            capture_now(shop)  # the markers (and the moves) stored: enrichment can go on
            busy += _wait_for_progress(dsn, before, 60, WINDOW_VIEWS)
            _append_views(dsn, store, rng, clock, 30, cities)
            capture_now(shop)
            time.sleep(rng.uniform(0.0, 1.0))
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            child.stdout.close()
        assert busy >= WINDOW_KILLS // 2, "the children rarely committed: the kills proved little"
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.projections.kill_child", "window_projections.py", dsn,
             "redis://unused", home, "finish"], stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, start_new_session=True)
        out, _ = child.communicate(timeout=300)
        assert child.returncode == 0 and b"caught up" in out
        with Catalog(dsn) as catalog:
            # counted in its window or listed late, exactly once, whatever the kills split
            check(dsn, catalog, "per_minute")
            with psycopg.connect(dsn) as conn:
                (late,) = conn.execute("SELECT count(*) FROM lakefold.late_events "
                                       "WHERE view = 'per_minute'").fetchone() or (0,)
                positions = {str(e): int(p) for e, p in conn.execute(
                    "SELECT e.event_id, p.first_position + e.ordinal FROM lakefold.events e "
                    "JOIN lakefold.event_positions p ON p.xid = e.xid "
                    "WHERE e.category = 'site'")}
            assert late > 0
            # searches joined to clicks, and visits in sessions, as SQL says, late ones listed
            for name in JOINS:
                check_join(dsn, catalog, name)
            check_sessions(dsn, catalog)
            # each view enriched with the city its customer had when it was appended
            enriched = _table(catalog, "views_with_city", "position")
            assert {p: r["city"] for p, r in enriched.items()} == {
                positions[e]: city for e, city in cities.items()}
    finally:
        store.close()
