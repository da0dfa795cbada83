"""``lakefold status``: per projection its generation, position, lag in records and seconds,
throughput, state, last error and the changelog streams whose compaction it holds; per view the
same per input (a captured table's stream, or another view's output); per capture slot its
health.

Everything is read from the catalog and the stores, so status works from any process, with or
without the projections module. A projection whose catalog state says ``running`` but whose
generation lock no session holds is reported as ``stopped`` (its runner died or was stopped);
one resumed whose catalog state still says ``paused`` as ``resuming`` (no runner has taken the
resume up yet: a running one does within a poll interval).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg

from lakefold.core.dsn import mask_dsn
from lakefold.core.exceptions import LakefoldError
from lakefold.projections.exceptions import ProjectionTerminalError
from lakefold.projections.operators._view_core import output_stream, view_owner
from lakefold.projections.operators._view_events import feed_position, feed_stream
from lakefold.projections.state._catalog import (
    LOCK_NAMESPACE,
    Catalog,
    Generation,
    generation_lock_key,
)
from lakefold.projections.state._deadletters import DeadLetters
from lakefold.projections.state._late_events import count_late
from lakefold.projections.state._readers import compaction_holders
from lakefold.projections.state._stream_state import LatestRows
from lakefold.spark.internals import (
    ChangelogSource,
    DeltaSource,
    EventSource,
    Source,
    source_reads,
)

_LAG_WINDOW = 10_000


@dataclass(frozen=True)
class SourceStatus:
    """One source of a projection: the last position processed, the head, the lag."""

    source: str
    position: int
    head: int
    lag_records: int
    lag_seconds: float


@dataclass(frozen=True)
class ProjectionStatus:
    """One projection as ``lakefold status`` shows it."""

    name: str
    target: str
    generation: int
    state: str
    paused: bool
    position: dict[str, int]
    lag_records: int
    lag_seconds: float
    throughput_per_s: float
    last_batch_at: str | None
    last_error: str | None
    dead_letters: int
    rebuilding_generation: int | None = None
    rebuild_position: dict[str, int] = field(default_factory=dict)
    sources: list[SourceStatus] = field(default_factory=list)
    #: Changelog streams whose compaction this projection holds (stream → its position).
    holds_compaction: dict[str, int] = field(default_factory=dict)
    #: ``view`` for a view (its ``sources`` are its inputs), else ``projection``.
    style: str = "projection"
    #: Of a windowed view: its events not counted because their window had closed, not
    #: replayed (``lakefold late list``), and its watermark (ISO time; None before events).
    late_events: int = 0
    watermark: str | None = None
    #: Errors it ran into, counted by the catalog (``Catalog.set_state``): each time it went
    #: ``retrying`` or ``failed`` with an error, the same error again included.
    errors_total: int = 0

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SlotStatus:
    """A logical replication slot on the source: is it streaming, how much WAL it holds."""

    slot: str
    active: bool
    wal_status: str | None
    retained_bytes: int | None
    safe_wal_size: int | None
    healthy: bool


def _sources(definition: dict[str, Any] | None) -> list[Source]:
    if not definition:
        return []
    found: list[Source] = []
    for entry in definition.get("sources", []):
        if entry.get("kind") == "events":
            found.append(EventSource(category=entry.get("category"),
                                     types=tuple(entry.get("types") or ()),
                                     alias=entry["alias"]))
        elif entry.get("kind") == "changelog":
            found.append(ChangelogSource(table=entry["table"], alias=entry["alias"]))
        elif entry.get("kind") == "delta":
            found.append(DeltaSource(uri=entry["uri"], key=tuple(entry.get("key") or ()),
                                     alias=entry["alias"],
                                     starting_version=entry.get("starting_version")))
    return found


def _lag_seconds(dsn: str, source: Source, next_position: int, head: int) -> float:
    """Age of the oldest record not yet processed (0 when caught up)."""
    if next_position > head:
        return 0.0
    for batch in source_reads.read(dsn, source, next_position,
                                    min(head + 1, next_position + _LAG_WINDOW)):
        if batch.num_rows:
            oldest = batch.column("_ts")[0].as_py()
            if oldest is None:
                return 0.0
            return float(max(0.0, (dt.datetime.now(dt.UTC) - oldest).total_seconds()))
    return 0.0


def _view_sources(catalog: Catalog, dsn: str, name: str, definition: dict[str, Any],
                  generation: Generation) -> list[SourceStatus]:
    """A view's inputs: the position its generation has applied of each input's stream."""
    owner = view_owner(name, generation.generation)
    result = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for alias, entry in (definition.get("inputs") or {}).items():
            events = entry.get("events")
            if events is not None:
                source = EventSource(category=events["category"],
                                             types=tuple(events["types"]), alias=alias)
                stream = feed_stream(name, generation.generation, alias)
                try:
                    applied = feed_position(conn, stream)
                    head = source_reads.head(dsn, source)
                except (LakefoldError, psycopg.errors.UndefinedTable):
                    continue  # not started yet
                lag = max(0, head - applied + 1)
                seconds = _lag_seconds(dsn, source, applied, head) if lag else 0.0
                result.append(SourceStatus(f"{alias} ({source.label})", applied - 1, head, lag,
                                           round(seconds, 3)))
                continue
            if entry.get("table") is not None:
                stream = str(entry["table"])
            else:
                upstream = str(entry["view"])
                stream = output_stream(upstream, catalog.current(upstream).generation)
            try:
                applied = LatestRows(owner, stream).position(conn)
                head = source_reads.head(dsn, ChangelogSource(table=stream, alias=alias))
            except (LakefoldError, psycopg.errors.UndefinedTable):
                continue  # not started yet
            lag = max(0, head - applied + 1)
            seconds = _lag_seconds(dsn, ChangelogSource(table=stream, alias=alias), applied,
                                   head) if lag else 0.0
            result.append(SourceStatus(f"{alias} ({stream})", applied - 1, head, lag,
                                       round(seconds, 3)))
    return result


def _window_status(dsn: str, name: str, definition: dict[str, Any],
                   generation: Generation) -> tuple[int, str | None]:
    """A windowed (or interval-join) view's late events not replayed, and its watermark."""
    window = definition.get("window")
    join = definition.get("interval_join")
    if join:  # both joined feeds keep the largest event time of the two
        window = {"input": str(join["left"]).split(".")[0], "lateness": join["lateness"]}
    if not window:
        return 0, None
    stream = feed_stream(name, generation.generation, window["input"])
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            late = count_late(conn, name)
            row = conn.execute("SELECT max_event_time FROM lakefold.event_feeds "
                               "WHERE stream = %s", (stream,)).fetchone()
        except psycopg.errors.UndefinedTable:
            return 0, None  # not started yet
    if row is None or row[0] is None:
        return late, None
    micros = int(row[0]) - round(float(window["lateness"]) * 1_000_000)
    moment = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)
    return late, moment.isoformat()


def _locked(dsn: str, name: str, generation: int) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
            "AND objid = %s AND objsubid = 2 AND granted",
            (LOCK_NAMESPACE, generation_lock_key(name, generation))).fetchone()
    return bool(row and row[0])


def _source_status(dsn: str, sources: list[Source], generation: Generation
                   ) -> list[SourceStatus]:
    result = []
    for source in sources:
        try:
            head = source_reads.head(dsn, source)
        except LakefoldError:
            continue
        next_position = int(generation.position.get(source.alias, 0))
        if isinstance(source, DeltaSource):
            result.append(_delta_status(source, next_position, head))
            continue
        lag = max(0, head - max(next_position, 1) + 1) if head else 0
        seconds = _lag_seconds(dsn, source, max(next_position, 1), head) if lag else 0.0
        result.append(SourceStatus(source.alias, max(0, next_position - 1), head, lag,
                                   round(seconds, 3)))
    return result


def _delta_status(source: DeltaSource, next_position: int, head: int) -> SourceStatus:
    """A Delta input: its position and head are table versions (the last one applied, -1
    before any; the newest), its lag the change rows of the versions not applied yet (as
    their commits count them, an update's pre-image included)."""
    from lakefold.spark.internals import delta_version_at

    applied = delta_version_at(next_position) - 1 if next_position else -1
    newest = delta_version_at(head)
    lag = source_reads.records_between(source, next_position, head + 1) \
        if applied < newest else 0
    seconds = _lag_seconds("", source, next_position, head) if applied < newest else 0.0
    return SourceStatus(source.alias, applied, newest, lag, round(seconds, 3))


def projection_status(catalog: Catalog, dsn: str, names: list[str] | None = None
                      ) -> list[ProjectionStatus]:
    """Status of every projection in the catalog (or of ``names``)."""
    dead = DeadLetters(catalog)
    holders = compaction_holders(dsn)
    statuses = []
    for row in catalog.projections():
        if names and row.name not in names:
            continue
        current = catalog.current(row.name)
        building = catalog.building(row.name)
        definition = catalog.definition(row.name) or {}
        style = "view" if definition.get("style") == "view" else "projection"
        sources = _view_sources(catalog, dsn, row.name, definition, current) \
            if style == "view" else _source_status(dsn, _sources(definition), current)
        state = row.state
        if state in ("running", "rebuilding", "retrying") and not _locked(
                dsn, row.name, current.generation):
            state = "stopped"
        if row.paused:
            state = "paused"
        elif state == "paused":  # resumed; no runner has taken the resume up yet
            state = "resuming"
        late, watermark = _window_status(dsn, row.name, definition, current) \
            if style == "view" else (0, None)
        statuses.append(ProjectionStatus(
            name=row.name, target=row.target_kind, generation=current.generation, state=state,
            paused=row.paused, position={s.source: s.position for s in sources},
            lag_records=sum(s.lag_records for s in sources),
            lag_seconds=max((s.lag_seconds for s in sources), default=0.0),
            throughput_per_s=round(catalog.throughput(row.name, current.generation), 1),
            last_batch_at=current.last_batch_at.isoformat() if current.last_batch_at else None,
            last_error=row.last_error, dead_letters=dead.count_open(row.name),
            rebuilding_generation=building.generation if building else None,
            rebuild_position={a: max(0, p - 1) for a, p in building.position.items()}
            if building else {},
            sources=sources, holds_compaction=holders.get(row.name, {}), style=style,
            late_events=late, watermark=watermark, errors_total=row.errors_total))
    return statuses


def slot_status(source_dsn: str) -> list[SlotStatus]:
    """Health of the logical (pgoutput) slots on the source database: a slot is healthy when
    its WAL is not lost or about to be (``wal_status`` reserved/extended)."""
    try:
        with psycopg.connect(source_dsn, autocommit=True, connect_timeout=10) as conn:
            rows = conn.execute(
                "SELECT slot_name, active, wal_status, "
                "pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, "
                "safe_wal_size FROM pg_replication_slots WHERE plugin = 'pgoutput' "
                "AND database = current_database() ORDER BY slot_name").fetchall()
    except psycopg.OperationalError as e:
        raise ProjectionTerminalError(
            f"cannot read replication slots at {mask_dsn(source_dsn)} ({e}); check LAKEFOLD_DSN"
        ) from e
    return [SlotStatus(slot=str(r[0]), active=bool(r[1]), wal_status=r[2],
                       retained_bytes=None if r[3] is None else int(r[3]),
                       safe_wal_size=None if r[4] is None else int(r[4]),
                       healthy=r[2] in ("reserved", "extended", None))
            for r in rows]
