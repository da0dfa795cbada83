"""Helpers for projection tests: a shop schema in a source database captured into the store,
events in the event store, and fresh computations to compare views with."""

from __future__ import annotations

import random
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg

from lakefold.capture import Capture, CaptureConfig, parse_lsn
from lakefold.core.exceptions import LakefoldError
from lakefold.eventstore import EventStore
from lakefold.projections.operations import Catalog
from lakefold.schemas.events import NewEvent

SHOP_DDL = [
    "CREATE TABLE customers (id bigint PRIMARY KEY, name text NOT NULL, email text, city text)",
    "CREATE TABLE products (id bigint PRIMARY KEY, name text NOT NULL, description text, "
    "price numeric(10,2) NOT NULL)",
]


def create_shop(dsn: str) -> None:
    """The shop tables, with a capture slot attached (changes from now on are captured)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in SHOP_DDL:
            conn.execute(statement)
    Capture(capture_config(dsn)).setup()


def capture_config(dsn: str) -> CaptureConfig:
    return CaptureConfig(source_dsn=dsn, store_dsn=dsn, slot="t_projections",
                         publication="t_projections", tables=("public.customers",
                                                               "public.products"))


def capture_now(dsn: str) -> None:
    """Capture everything written to the source so far into the changelog store."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    lsn = str(row[0])
    Capture(capture_config(dsn)).run(until_lsn=parse_lsn(lsn))


def write_customers(dsn: str, rng: random.Random, count: int, *, start: int = 0) -> None:
    """Insert, update and delete customers; returns nothing (read the table for truth)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(start, start + count):
            conn.execute("INSERT INTO customers VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO "
                         "UPDATE SET name = EXCLUDED.name, city = EXCLUDED.city",
                         (rng.randrange(count + start), f"name {i}", f"c{i}@example.com",
                          rng.choice(["Oslo", "Lyon", "Porto"])))
            if rng.random() < 0.1:
                conn.execute("DELETE FROM customers WHERE id = %s", (rng.randrange(count + start),))


def write_products(dsn: str, rng: random.Random, count: int) -> None:
    words = ["red", "blue", "kettle", "mug", "lamp", "chair", "steel", "oak", "glass"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(count):
            pid = rng.randrange(max(2, count // 3))
            conn.execute(
                "INSERT INTO products VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET "
                "name = EXCLUDED.name, description = EXCLUDED.description, price = EXCLUDED.price",
                (pid, " ".join(rng.sample(words, 2)), " ".join(rng.sample(words, 4)),
                 Decimal(rng.randrange(100, 10_000)) / 100))


def customers(dsn: str) -> dict[int, dict[str, str]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, name, email, city FROM customers").fetchall()
    return {r[0]: {"id": str(r[0]), "name": r[1], "email": r[2], "city": r[3]} for r in rows}


def products(dsn: str) -> dict[int, tuple[str, str, Decimal]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, name, description, price FROM products").fetchall()
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


NOTE_WORDS = ["gift", "urgent", "fragile", "express", "paper", "glass", "box", "wrap"]


def orders_expected(dsn: str) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """From the event store itself: the last order per customer, and every order's note."""
    import json

    from lakefold.eventstore.arrow import head_position, read_events_range

    last: dict[str, dict[str, str]] = {}
    notes: dict[str, str] = {}
    for batch in read_events_range(dsn, 1, head_position(dsn) + 1, category="order"):
        for stream, text in zip(batch.column("stream_id").to_pylist(),
                                batch.column("data").to_pylist(), strict=True):
            data = json.loads(text)
            last[data["customer"]] = {"customer": data["customer"], "order": stream,
                                      "amount": data["amount"]}
            notes[stream] = data["note"]
    return last, notes


def append_orders(dsn: str, rng: random.Random, count: int, *, poison_every: int = 0,
                  first: int = 0, antidote: str | None = None,
                  poisoned: dict[str, Decimal] | None = None) -> dict[str, Decimal]:
    """OrderPlaced events (customer, amount) in category ``order``; returns the expected
    revenue per customer (poison events excluded)."""
    store = EventStore(dsn)
    store.install()
    expected: dict[str, Decimal] = {}
    for i in range(first, first + count):
        customer = f"c{rng.randrange(7)}"
        amount = Decimal(rng.randrange(100, 5_000)) / 100
        poison = bool(poison_every) and (i + 1) % poison_every == 0
        note = " ".join(rng.sample(NOTE_WORDS, 3))
        store.append(f"order-{i}", [NewEvent(type="OrderPlaced", data={
            "customer": customer, "amount": str(amount), "poison": poison, "note": note,
            "antidote": antidote})])
        if poison and poisoned is not None:
            poisoned[customer] = poisoned.get(customer, Decimal(0)) + amount
        if not poison:
            expected[customer] = expected.get(customer, Decimal(0)) + amount
    store.close()
    return expected


def stream_batches(frame: Any, checkpoint: Path, records: int) -> list[list[Any]]:
    """The micro-batches (rows) a streaming ``frame`` delivers under a 100 ms processing-time
    trigger (which honours read limits; availableNow reads all in one batch) until ``records``
    have arrived, plus a second in which a trailing batch would run."""
    seen: list[list[Any]] = []
    query = (frame.writeStream.foreachBatch(lambda df, i: seen.append(df.collect()))
             .option("checkpointLocation", str(checkpoint))
             .trigger(processingTime="100 milliseconds").start())
    deadline = time.monotonic() + 60
    while sum(len(batch) for batch in seen) < records and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1)  # a batch past the end would run within a few triggers
    query.stop()
    return seen


def committed_batches(catalog: Catalog, names: tuple[str, ...]) -> tuple[int, ...]:
    """The last committed batch id of each projection: -1 for none yet (ids start at 0, so a
    first batch must not read as none), and -1 for all while the catalog does not exist."""
    try:
        ids = [catalog.current(name).batch_id for name in names]
    except LakefoldError:
        return (-1,) * len(names)
    return tuple(-1 if batch_id is None else batch_id for batch_id in ids)


def wait_for_commits(catalog: Catalog, names: tuple[str, ...], before: tuple[int, ...], *,
                     timeout: float) -> bool:
    """Whether every projection committed a batch after ``before`` within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(map(int.__lt__, before, committed_batches(catalog, names))):
            return True
        time.sleep(0.2)
    return False
