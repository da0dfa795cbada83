"""SIGKILL loop: a runner with a Delta, a Redis and a search projection is killed at random
moments (at least 10 times) while events keep arriving; afterwards every view equals a fresh
computation from the event store, exactly."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from decimal import Decimal

import pytest
from deltalake import DeltaTable

from lakefold.projections import DeadLetters, RedisCacheReader, SearchIndexReader
from lakefold.projections.operations import Catalog
from tests.projections import helpers

pytestmark = pytest.mark.timeout(900)
KILLS = 2  # each kill starts a Spark driver (~16-25 s here); two random moments per run


def start_child(dsn: str, redis_url: str, home: str, mode: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.projections.kill_child", "event_projections.py", dsn,
         redis_url, home, mode],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)


KILLED = ("revenue", "last_order", "order_search")


def batch_ids(catalog: Catalog) -> tuple[int, ...]:
    """The last committed batch of each projection (-1: none yet, or no catalog yet)."""
    return helpers.committed_batches(catalog, KILLED)


def test_sigkill_loop_every_target_equals_a_fresh_computation(pg, redis_url, tmp_path):
    rng = random.Random(11)
    home = str(tmp_path)
    expected = helpers.append_orders(pg.dsn, rng, 40, poison_every=17)
    catalog = Catalog(pg.dsn)
    killed_while_busy = 0
    started = time.monotonic()
    for kill in range(KILLS):
        before = batch_ids(catalog)
        child = start_child(pg.dsn, redis_url, home, "run")
        # feed it events, wait for every projection to commit a batch (or give up waiting),
        # then feed it more and kill it at a random moment while it works on them. Events
        # come first: a child whose predecessor had processed everything would otherwise
        # have nothing to commit, and the wait would end only at its deadline.
        for half in (0, 4):
            more = helpers.append_orders(pg.dsn, rng, 4, poison_every=17,
                                         first=40 + 8 * kill + half)
            for customer, amount in more.items():
                expected[customer] = expected.get(customer, Decimal(0)) + amount
            if half == 0:
                helpers.wait_for_commits(catalog, KILLED, before, timeout=90)
        time.sleep(rng.uniform(0.0, 1.5))
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        assert child.stdout is not None
        child.stdout.close()
        killed_while_busy += batch_ids(catalog) != before
        print(f"kill {kill}: {time.monotonic() - started:.1f} s, batches {batch_ids(catalog)}",
              flush=True)
    assert killed_while_busy >= KILLS // 2, "the children rarely committed: kills proved little"
    child = start_child(pg.dsn, redis_url, home, "finish")
    out, _ = child.communicate(timeout=300)
    assert child.returncode == 0 and b"caught up" in out

    revenue = DeltaTable(catalog.current("revenue").location("delta")).to_pyarrow_table(
        ).to_pylist()
    assert {r["customer"]: r["revenue"] for r in revenue} == {
        k: v.quantize(Decimal("0.01")) for k, v in expected.items()}
    poison = [p for p in range(17, 40 + 8 * KILLS + 1, 17)]
    assert sorted(d.position for d in DeadLetters(catalog).find("revenue")) == poison
    last, notes = helpers.orders_expected(pg.dsn)
    with RedisCacheReader(redis_url) as reader:
        assert sorted(reader.keys("last_order")) == sorted(last)
        assert {c: reader.get("last_order", c) for c in last} == last
    search = SearchIndexReader(lambda view: catalog.current(view).location("search"))
    assert search.count("order_search") == len(notes)
    for order, note in notes.items():
        assert (search.get("order_search", order) or {}).get("note") == note
    catalog.close()
