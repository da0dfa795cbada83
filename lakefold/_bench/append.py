"""``lakefold bench append``: the event store's write and read paths against raw COPY and the
``eventsourcing`` library's PostgreSQL recorder, on one throwaway server (fsync on).

Workloads, for lakefold and for the peer, each on its own database of the same server:

- batched: ``--events`` events in calls of 1,000 (one new stream per call), the events of
  each call in hand before the clock starts (as the baseline's rows are): ``NewEvent`` values
  with dict payloads for lakefold, which validates and encodes them inside the call, and the
  peer's ``StoredEvent`` values, already serialised. ``batched_incl_building_events_per_s``
  adds the time spent building them;
- single, 1 writer and 16 writers: ``--single-events`` one-event appends in total, each to the
  writer's own streams with an exact expected version (the aggregate pattern), latency per call;
- read: every event of the batched workload, in pages of 10,000, in global order.

The two sides are *interleaved* (a slice of lakefold's workload, then the same slice of the
peer's, alternating who goes first) so that load from other processes on the machine hits
both alike; each figure is the total work over the total time of its side. Reads are repeated
``READ_ROUNDS`` times per side and the best round counts. The baseline is raw COPY (the limit)
of ``--events`` rows, built before the clock starts, into a copy of ``lakefold.events`` (same
columns, constraints and indexes). For single events, payloads, ids and stream layouts are
built inside the timed code. lakefold's background sequencer runs
during its write workloads (its cost is included); reads start after ``head()``.

Before each workload, outside the clock, both databases are vacuumed and analysed and the server
checkpoints (as ``pgbench`` vacuums before it measures): otherwise the writing of the
baseline's rows, or autovacuum of the batched workload's 2 x ``--events`` new rows and the
checkpoint they force, run during whichever slices they happen to meet, and a figure measures
them rather than the stores.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Protocol

import psycopg
import typer
from psycopg import sql

from lakefold._bench import bench_app
from lakefold._bench.report import BenchmarkError, Report

BATCH = 1000
READ_PAGE = 10_000
READ_ROUNDS = 3
WRITERS = 16
STREAMS_PER_WRITER = 20
SLICES = 8  # how many alternating slices each write workload is cut into


def _payload(i: int) -> dict[str, Any]:
    return {"order_id": f"o-{i}", "customer": f"c-{i % 997}", "amount_cents": 1250 + i % 100,
            "items": [{"sku": f"s-{i % 50}", "qty": 1 + i % 3}]}


class Side(Protocol):
    """One event store under test."""

    def build_batch(self, b: int) -> object: ...
    def batch(self, built: Any) -> None: ...
    def single(self, key: str, writer: int, n: int) -> None: ...
    def read_all(self) -> int: ...


class Lakefold:
    """``lakefold.eventstore.EventStore``: NewEvent values, exact expected versions."""

    def __init__(self, dsn: str) -> None:
        from lakefold.eventstore import EventStore, StoreOptions

        self.store = EventStore(dsn, options=StoreOptions(pool_size=WRITERS + 4))
        self.store.install()
        self.versions: dict[str, int] = {}

    def build_batch(self, b: int) -> tuple[str, list[Any]]:
        from lakefold.schemas.events import NewEvent

        return f"order-{b}", [NewEvent("order.placed", _payload(b * BATCH + i))
                              for i in range(BATCH)]

    def batch(self, built: tuple[str, list[Any]]) -> None:
        from lakefold.eventstore import NO_STREAM

        self.store.append(built[0], built[1], expected_version=NO_STREAM)

    def single(self, key: str, writer: int, n: int) -> None:
        from lakefold.schemas.events import NewEvent

        stream = f"{key}-{writer}-{n % STREAMS_PER_WRITER}"
        version = self.versions.get(stream, 0)
        self.store.append(stream, [NewEvent("order.placed", _payload(n))],
                          expected_version=version)
        self.versions[stream] = version + 1

    def read_all(self) -> int:
        head = self.store.head()
        position, read = 1, 0
        while True:
            page = self.store.read_all(position, READ_PAGE)
            read += len(page)
            if len(page) < READ_PAGE:
                break
            position = (page[-1].position or position) + 1
        if read != head:
            raise BenchmarkError(f"read {read} events, but the head is {head}")
        return read

    def close(self) -> None:
        self.store.close()


class EventsourcingPeer:
    """``eventsourcing``'s ``PostgresApplicationRecorder`` (9.5.x): StoredEvents, one stream
    per batch, versions tracked by the caller as its aggregates do."""

    topic = "bench:OrderPlaced"

    def __init__(self, port: int, dbname: str) -> None:
        from eventsourcing.persistence import InfrastructureFactory
        from eventsourcing.postgres import PostgresApplicationRecorder
        from eventsourcing.utils import Environment

        env = Environment(name="bench", env={
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": dbname, "POSTGRES_HOST": "127.0.0.1",
            "POSTGRES_PORT": str(port), "POSTGRES_USER": "postgres", "POSTGRES_PASSWORD": "",
            "POSTGRES_POOL_SIZE": str(WRITERS + 4), "POSTGRES_MAX_OVERFLOW": "10",
            "CREATE_TABLE": "yes",
        })
        # Without an explicit environment the factory silently uses its in-memory store.
        self.factory = InfrastructureFactory.construct(env)
        self.recorder = self.factory.application_recorder()
        if not isinstance(self.recorder, PostgresApplicationRecorder):
            raise BenchmarkError(f"the eventsourcing peer is {type(self.recorder).__name__}, "
                                "not its PostgreSQL recorder")
        self.streams: dict[str, uuid.UUID] = {}
        self.versions: dict[str, int] = {}

    def build_batch(self, b: int) -> list[Any]:
        from eventsourcing.persistence import StoredEvent

        stream = uuid.uuid4()
        return [StoredEvent(stream, i + 1, self.topic,
                            json.dumps(_payload(b * BATCH + i)).encode()) for i in range(BATCH)]

    def batch(self, built: list[Any]) -> None:
        self.recorder.insert_events(built)

    def single(self, key: str, writer: int, n: int) -> None:
        from eventsourcing.persistence import StoredEvent

        name = f"{key}-{writer}-{n % STREAMS_PER_WRITER}"
        stream = self.streams.setdefault(name, uuid.uuid4())
        version = self.versions.get(name, 0) + 1
        self.recorder.insert_events([StoredEvent(stream, version, self.topic,
                                                 json.dumps(_payload(n)).encode())])
        self.versions[name] = version

    def read_all(self) -> int:
        total = self.recorder.max_notification_id() or 0
        start, read = 1, 0
        while True:
            page = self.recorder.select_notifications(start, READ_PAGE)
            read += len(page)
            if len(page) < READ_PAGE:
                break
            start = page[-1].id + 1
        if read != total:
            raise BenchmarkError(f"the peer read {read} events, but stored {total}")
        return read

    def close(self) -> None:
        self.factory.close()


def _percentile_ms(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))] * 1e3


def _threads(writers: int, per_writer: int, first: int, step: Callable[[int, int], None],
             latencies: list[float]) -> float:
    """``writers`` threads each run ``step(writer, n)`` for ``n`` in ``[first, first +
    per_writer)``; returns the elapsed seconds and adds per-call latencies."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(writers + 1)
    mine: list[list[float]] = [[] for _ in range(writers)]

    def work(w: int) -> None:
        barrier.wait()
        try:
            for n in range(first, first + per_writer):
                started = time.perf_counter()
                step(w, n)
                mine[w].append(time.perf_counter() - started)
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
    for per in mine:
        latencies.extend(per)
    return elapsed


def _interleaved(sides: list[Side], slices: list[Callable[[Side], float]]) -> list[float]:
    """Run every slice on every side, alternating which side goes first; total seconds per
    side."""
    totals = [0.0] * len(sides)
    for i, run_slice in enumerate(slices):
        order = list(range(len(sides))) if i % 2 == 0 else list(reversed(range(len(sides))))
        for s in order:
            totals[s] += run_slice(sides[s])
    return totals


def copy_baseline(dsn: str, events: int) -> float:
    """Rows per second of raw COPY (the limit): ``events`` rows, built before the clock starts,
    copied in one statement into ``copy_events``, a table created ``LIKE lakefold.events
    INCLUDING ALL`` (the same columns, defaults, constraints and indexes)."""
    from lakefold.eventstore import EventStore
    from lakefold.schemas.events import new_event_id

    with EventStore(dsn) as store:
        store.install()
    chunks = [
        "".join(
            f"{i}\t{new_event_id().hex}\torder-{b}\t{i - b * BATCH + 1}\torder\t"
            f"order.placed\t1\t{json.dumps(_payload(i), separators=(',', ':'))}\t{{}}\n"
            for i in range(b * BATCH, min(events, (b + 1) * BATCH))
        ).encode()
        for b in range(-(-events // BATCH))
    ]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE copy_events (LIKE lakefold.events INCLUDING ALL)")
        started = time.perf_counter()
        with conn.cursor().copy(
            "COPY copy_events (ordinal, event_id, stream_id, stream_version, category, type, "
            "schema_version, data, metadata) FROM STDIN"
        ) as copy:
            for chunk in chunks:
                copy.write(chunk)
        return events / (time.perf_counter() - started)


def _batched(sides: list[Side], events: int) -> list[tuple[float, float]]:
    """(events/s appending events in hand, events/s including building them) per side."""
    batches = events // BATCH
    per_slice = max(1, batches // SLICES)
    building = [0.0] * len(sides)

    def slice_runner(first: int) -> Callable[[Side], float]:
        def run(side: Side) -> float:
            started = time.perf_counter()
            built = [side.build_batch(b) for b in range(first, min(batches, first + per_slice))]
            building[sides.index(side)] += time.perf_counter() - started
            started = time.perf_counter()
            for one in built:
                side.batch(one)
            return time.perf_counter() - started
        return run

    totals = _interleaved(sides, [slice_runner(s) for s in range(0, batches, per_slice)])
    return [(batches * BATCH / total, batches * BATCH / (total + build))
            for total, build in zip(totals, building, strict=True)]


def _singles(sides: list[Side], single: int, writers: int, key: str
             ) -> list[tuple[float, float, float]]:
    """(events/s, p50 ms, p99 ms) per side for one-event appends by ``writers`` threads."""
    per_writer = max(SLICES, single // writers) // SLICES
    latencies: list[list[float]] = [[] for _ in sides]

    def slice_runner(k: int) -> Callable[[Side], float]:
        def run(side: Side) -> float:
            return _threads(writers, per_writer, k * per_writer,
                            lambda w, n: side.single(key, w, n),
                            latencies[sides.index(side)])
        return run

    totals = _interleaved(sides, [slice_runner(k) for k in range(SLICES)])
    out = []
    for total, lat in zip(totals, latencies, strict=True):
        lat.sort()
        out.append((len(lat) / total, _percentile_ms(lat, 0.5), _percentile_ms(lat, 0.99)))
    return out


def _reads(sides: list[Side]) -> list[float]:
    best = [0.0] * len(sides)
    for _ in range(READ_ROUNDS):
        counts = [0] * len(sides)

        def read(side: Side, counts: list[int] = counts) -> float:
            started = time.perf_counter()
            counts[sides.index(side)] = side.read_all()
            return time.perf_counter() - started

        for s, total in enumerate(_interleaved(sides, [read])):
            best[s] = max(best[s], counts[s] / total)
    return best


def settle(dsns: list[str]) -> None:
    """Vacuum and analyse every database in ``dsns``, then checkpoint the server: the
    background work that earlier writes left is done before the next workload starts."""
    for dsn in dsns:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("VACUUM (ANALYZE)")
    with psycopg.connect(dsns[0], autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def measure(sides: list[Side], events: int, single: int,
            between: Callable[[], None] = lambda: None) -> list[dict[str, float]]:
    """Every workload on every side, interleaved; one result dict per side. ``between`` runs
    before each workload (the first one follows the baseline's COPY), outside the clock."""
    results: list[dict[str, float]] = [{} for _ in sides]
    between()
    for result, (rate, with_building) in zip(results, _batched(sides, events), strict=True):
        result["batched_events_per_s"] = rate
        result["batched_incl_building_events_per_s"] = with_building
    for writers, key in ((1, "single_1w"), (WRITERS, "single_16w")):
        between()
        for result, (rate, p50, p99) in zip(results, _singles(sides, single, writers, key),
                                            strict=True):
            result[f"{key}_events_per_s"] = rate
            result[f"{key}_p50_ms"] = p50
            result[f"{key}_p99_ms"] = p99
    between()
    for result, rate in zip(results, _reads(sides), strict=True):
        result["read_events_per_s"] = rate
    return results


_RESULT_KEYS = ("batched_events_per_s", "batched_incl_building_events_per_s",
                "single_1w_events_per_s", "single_1w_p99_ms",
                "single_16w_events_per_s", "single_16w_p99_ms", "read_events_per_s")


def run(events: int, single: int) -> Report:
    """Start a durable throwaway PostgreSQL and run every workload on it."""
    from lakefold.local import LocalPostgres

    if events < BATCH or single < WRITERS * SLICES:
        raise BenchmarkError(f"use --events >= {BATCH} and --single-events >= "
                            f"{WRITERS * SLICES}")
    report = Report(benchmark="append", params={
        "events": events, "single_events": single, "batch": BATCH, "writers": WRITERS,
        "read_page": READ_PAGE, "fsync": True, "interleaved_slices": SLICES,
        "settled_between_workloads": True})
    with LocalPostgres(durable=True) as server:
        server.start()
        with psycopg.connect(server.dsn(), autocommit=True) as admin:
            for name in ("copy_bench", "lakefold_bench", "es_bench"):
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        report.baseline["copy_rows_per_s"] = copy_baseline(server.dsn("copy_bench"), events)
        ours = Lakefold(server.dsn("lakefold_bench"))
        peer = EventsourcingPeer(server.port, "es_bench")
        try:
            mine, theirs = measure(
                [ours, peer], events, single,
                lambda: settle([server.dsn("lakefold_bench"), server.dsn("es_bench")]))
        finally:
            ours.close()
            peer.close()
    report.results.update({key: mine[key] for key in _RESULT_KEYS})
    report.peers.update({f"eventsourcing_{key}": theirs[key] for key in _RESULT_KEYS})
    report.params["p50_ms"] = {
        "lakefold": {k: mine[k] for k in ("single_1w_p50_ms", "single_16w_p50_ms")},
        "eventsourcing": {k: theirs[k] for k in ("single_1w_p50_ms", "single_16w_p50_ms")},
    }
    return report


@bench_app.command("append")
def append(
    events: Annotated[int, typer.Option(help="Events for the batched, COPY and read "
                                             "workloads.")] = 200_000,
    single_events: Annotated[int, typer.Option(help="Events for each single-event "
                                                    "workload.")] = 16_000,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Event store appends and reads vs raw COPY and the eventsourcing library."""
    run(events, single_events).emit(as_json=as_json)
