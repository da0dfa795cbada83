"""``lakefold bench append``: the event store's write and read paths against raw COPY and the
``eventsourcing`` library's PostgreSQL recorder, on one throwaway server (fsync on).

Workloads, each run for lakefold and for the peer on its own database of the same server:

- batched: ``--events`` events in calls of 1,000 (one new stream per call);
- single, 1 writer and 16 writers: ``--single-events`` one-event appends in total, each to the
  writer's own streams with an exact expected version (the aggregate pattern), latency per call;
- read: every event of the batched workload, in pages of 10,000, in global order.

The baseline is raw binary COPY of ``--events`` rows into a table with the same columns and
unique keys. Payloads, ids and stream layouts are built inside the timed loops for everyone.
lakefold's background sequencer runs during its write workloads (its cost is included); the
read workload starts after ``head()`` so all positions are assigned.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import psycopg
import typer
from psycopg import sql
from psycopg.types.json import Jsonb

from lakefold._bench import bench_app
from lakefold._bench.report import Report
from lakefold.exceptions import LakefoldError

BATCH = 1000
READ_PAGE = 10_000
WRITERS = 16
STREAMS_PER_WRITER = 20


def _payload(i: int) -> dict[str, Any]:
    return {"order_id": f"o-{i}", "customer": f"c-{i % 997}", "amount_cents": 1250 + i % 100,
            "items": [{"sku": f"s-{i % 50}", "qty": 1 + i % 3}]}


@dataclass(frozen=True)
class Timings:
    """Events per second and per-call latency percentiles of one workload."""

    events_per_s: float
    p50_ms: float
    p99_ms: float


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))
    return sorted_values[index] * 1000


def _run_writers(writers: int, per_writer: int, step: Callable[[int, int], None]) -> Timings:
    """Run ``step(writer, n)`` ``per_writer`` times in each of ``writers`` threads."""
    latencies: list[list[float]] = [[] for _ in range(writers)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(writers + 1)

    def work(w: int) -> None:
        barrier.wait()
        try:
            mine = latencies[w]
            for n in range(per_writer):
                started = time.perf_counter()
                step(w, n)
                mine.append(time.perf_counter() - started)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    merged = sorted(x for per in latencies for x in per)
    return Timings(len(merged) / elapsed, _percentile(merged, 0.5), _percentile(merged, 0.99))


# -- baseline: raw COPY ---------------------------------------------------------------------

def copy_baseline(dsn: str, events: int) -> float:
    """Rows per second of one binary COPY into a table equivalent to ``lakefold.events``."""
    from lakefold.schemas.events import new_event_id

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE copy_events (id bigserial PRIMARY KEY, event_id uuid NOT NULL UNIQUE, "
            "stream_id text NOT NULL, stream_version bigint NOT NULL, type text NOT NULL, "
            "schema_version integer NOT NULL, data jsonb NOT NULL, metadata jsonb NOT NULL, "
            "recorded_at timestamptz NOT NULL DEFAULT now(), UNIQUE (stream_id, stream_version))"
        )
        started = time.perf_counter()
        with conn.cursor().copy(
            "COPY copy_events (event_id, stream_id, stream_version, type, schema_version, data, "
            "metadata) FROM STDIN (FORMAT BINARY)"
        ) as copy:
            copy.set_types(["uuid", "text", "int8", "text", "int4", "jsonb", "jsonb"])
            for i in range(events):
                copy.write_row((new_event_id(), f"order-{i // BATCH}", i % BATCH + 1,
                                "order.placed", 1, Jsonb(_payload(i)), Jsonb({})))
        return events / (time.perf_counter() - started)


# -- lakefold -------------------------------------------------------------------------------

def bench_lakefold(dsn: str, events: int, single: int) -> dict[str, float]:
    """The four workloads through ``lakefold.eventstore.EventStore``."""
    from lakefold.eventstore import NO_STREAM, EventStore, StoreOptions
    from lakefold.schemas.events import NewEvent

    results: dict[str, float] = {}
    with EventStore(dsn, options=StoreOptions(pool_size=WRITERS + 4)) as store:
        store.install()
        started = time.perf_counter()
        for b in range(events // BATCH):
            store.append(f"order-{b}", [NewEvent("order.placed", _payload(b * BATCH + i))
                                        for i in range(BATCH)], expected_version=NO_STREAM)
        results["batched_events_per_s"] = (events // BATCH * BATCH) / (
            time.perf_counter() - started)

        for writers, key in ((1, "single_1w"), (WRITERS, "single_16w")):
            versions = [[0] * STREAMS_PER_WRITER for _ in range(writers)]

            def step(w: int, n: int, versions: list[list[int]] = versions,
                     key: str = key) -> None:
                s = n % STREAMS_PER_WRITER
                store.append(f"{key}-{w}-{s}", [NewEvent("order.placed", _payload(n))],
                             expected_version=versions[w][s])
                versions[w][s] += 1

            timings = _run_writers(writers, max(1, single // writers), step)
            results[f"{key}_events_per_s"] = timings.events_per_s
            results[f"{key}_p50_ms"] = timings.p50_ms
            results[f"{key}_p99_ms"] = timings.p99_ms

        head = store.head()
        started = time.perf_counter()
        position, read = 1, 0
        while True:
            page = store.read_all(position, READ_PAGE)
            read += len(page)
            if len(page) < READ_PAGE:
                break
            position = page[-1].position + 1 if page[-1].position else position + READ_PAGE
        results["read_events_per_s"] = read / (time.perf_counter() - started)
        if read != head:
            raise LakefoldError(f"read {read} events, but the head is {head}")
    return results


# -- the peer: eventsourcing's PostgreSQL recorder ------------------------------------------

def _peer_recorder(port: int, dbname: str) -> tuple[Any, Any]:
    from eventsourcing.persistence import InfrastructureFactory
    from eventsourcing.postgres import PostgresApplicationRecorder
    from eventsourcing.utils import Environment

    env = Environment(name="bench", env={
        "PERSISTENCE_MODULE": "eventsourcing.postgres",
        "POSTGRES_DBNAME": dbname, "POSTGRES_HOST": "127.0.0.1", "POSTGRES_PORT": str(port),
        "POSTGRES_USER": "postgres", "POSTGRES_PASSWORD": "",
        "POSTGRES_POOL_SIZE": str(WRITERS + 4), "POSTGRES_MAX_OVERFLOW": "10",
        "CREATE_TABLE": "yes",
    })
    # Without an explicit environment the factory silently falls back to its in-memory store.
    factory = InfrastructureFactory.construct(env)
    recorder = factory.application_recorder()
    if not isinstance(recorder, PostgresApplicationRecorder):
        raise LakefoldError(f"the eventsourcing peer is {type(recorder).__name__}, not its "
                            "PostgreSQL recorder")
    return factory, recorder


def bench_eventsourcing(port: int, dbname: str, events: int, single: int) -> dict[str, float]:
    """The same workloads through ``eventsourcing``'s ``PostgresApplicationRecorder``."""
    from eventsourcing.persistence import StoredEvent

    topic = "bench:OrderPlaced"
    factory, recorder = _peer_recorder(port, dbname)
    results: dict[str, float] = {}
    try:
        started = time.perf_counter()
        for b in range(events // BATCH):
            stream = uuid.uuid4()
            recorder.insert_events([
                StoredEvent(stream, i + 1, topic, json.dumps(_payload(b * BATCH + i)).encode())
                for i in range(BATCH)
            ])
        results["batched_events_per_s"] = (events // BATCH * BATCH) / (
            time.perf_counter() - started)

        for writers, key in ((1, "single_1w"), (WRITERS, "single_16w")):
            streams = [[uuid.uuid4() for _ in range(STREAMS_PER_WRITER)] for _ in range(writers)]
            versions = [[0] * STREAMS_PER_WRITER for _ in range(writers)]

            def step(w: int, n: int, streams: list[list[uuid.UUID]] = streams,
                     versions: list[list[int]] = versions) -> None:
                s = n % STREAMS_PER_WRITER
                versions[w][s] += 1
                recorder.insert_events([StoredEvent(
                    streams[w][s], versions[w][s], topic, json.dumps(_payload(n)).encode())])

            timings = _run_writers(writers, max(1, single // writers), step)
            results[f"{key}_events_per_s"] = timings.events_per_s
            results[f"{key}_p50_ms"] = timings.p50_ms
            results[f"{key}_p99_ms"] = timings.p99_ms

        total = recorder.max_notification_id() or 0
        started = time.perf_counter()
        start, read = 1, 0
        while True:
            page = recorder.select_notifications(start, READ_PAGE)
            read += len(page)
            if len(page) < READ_PAGE:
                break
            start = page[-1].id + 1
        results["read_events_per_s"] = read / (time.perf_counter() - started)
        if read != total:
            raise LakefoldError(f"the peer read {read} events, but stored {total}")
    finally:
        factory.close()
    return results


_RESULT_KEYS = ("batched_events_per_s", "single_1w_events_per_s", "single_1w_p99_ms",
                "single_16w_events_per_s", "single_16w_p99_ms", "read_events_per_s")


def run(events: int, single: int) -> Report:
    """Start a durable throwaway PostgreSQL and run every workload on it."""
    from lakefold.local import LocalPostgres

    if events < BATCH or single < WRITERS:
        raise LakefoldError(f"use --events >= {BATCH} and --single-events >= {WRITERS}")
    report = Report(benchmark="append", params={
        "events": events, "single_events": single, "batch": BATCH, "writers": WRITERS,
        "read_page": READ_PAGE, "fsync": True})
    with LocalPostgres(durable=True) as server:
        server.start()
        with psycopg.connect(server.dsn(), autocommit=True) as admin:
            for name in ("copy_bench", "lakefold_bench", "es_bench"):
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        report.baseline["copy_rows_per_s"] = copy_baseline(server.dsn("copy_bench"), events)
        ours = bench_lakefold(server.dsn("lakefold_bench"), events, single)
        peer = bench_eventsourcing(server.port, "es_bench", events, single)
    report.results.update({key: ours[key] for key in _RESULT_KEYS})
    report.peers.update({f"eventsourcing_{key}": peer[key] for key in _RESULT_KEYS})
    report.params["lakefold_p50_ms"] = {k: ours[k] for k in ("single_1w_p50_ms",
                                                             "single_16w_p50_ms")}
    report.params["eventsourcing_p50_ms"] = {k: peer[k] for k in ("single_1w_p50_ms",
                                                                  "single_16w_p50_ms")}
    return report


@bench_app.command("append")
def append(
    events: Annotated[int, typer.Option(help="Events for the batched, COPY and read "
                                             "workloads.")] = 200_000,
    single_events: Annotated[int, typer.Option(help="Events for each single-event "
                                                    "workload.")] = 8_000,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Event store appends and reads vs raw COPY and the eventsourcing library."""
    run(events, single_events).emit(as_json=as_json)
