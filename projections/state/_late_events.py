"""Late events: what a windowed view did not count because the event's window had closed, kept
so that nothing is dropped silently (``lakefold late list|replay VIEW``).

One row per (view, generation, input, event position, window): the event's time, its stream,
the window, the watermark it came behind and by how much (``late_by``: how long the window had
been closed). A row is written in the view's batch transaction, so it is there exactly when the
batch that skipped the event committed. Each generation lists what it found late: a rebuild
classifies the same events as late as the live run (lateness is decided by the log, see
``_windows``), and its rows replace the live ones when it switches (a retired generation's rows
go with it). Listings show each (input, event, window) once. When a stream is deleted, its
events' rows leave the list as its events leave the view (``forget_late_streams``): a rebuild
never reads them, and a live run deletes them when it reads the deletion.

``replay`` marks rows ``replayed`` with a number from a sequence; each generation's feed folds
the replayed rows of its generation it has not folded yet into its window rows at its next
batch (the window is corrected, downstream views and targets follow), and a rebuild counts
replayed events where it would have found them late (a pair replayed in any generation), so it
gives the live run's rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import numpy as np
import psycopg

from lakefold.core import migrations
from lakefold.core.migrations import Migration
from lakefold.projections.exceptions import ProjectionDefinitionError

_DDL: Final = [
    """CREATE TABLE IF NOT EXISTS lakefold.late_events (
        view text NOT NULL,
        input text NOT NULL,
        position bigint NOT NULL,
        window_start timestamptz NOT NULL,
        window_end timestamptz NOT NULL,
        event_time timestamptz NOT NULL,
        watermark timestamptz NOT NULL,
        late_by interval NOT NULL,
        status text NOT NULL DEFAULT 'late' CHECK (status IN ('late', 'replayed')),
        replay_seq bigint,
        recorded_at timestamptz NOT NULL DEFAULT now(),
        replayed_at timestamptz,
        PRIMARY KEY (view, input, position, window_start))""",
    "CREATE SEQUENCE IF NOT EXISTS lakefold.late_event_replay_seq",
    """CREATE INDEX IF NOT EXISTS late_events_replays ON lakefold.late_events
        (view, input, replay_seq) WHERE status = 'replayed'""",
    # What an event was late for: "window" (it can be replayed into it), "session" (the
    # session it hit, ``_session_windows``), "join" (the span in which a partner had to
    # come, ``operators._interval_join``) or "change" (a table's change, ``_changelog_windows``);
    # added after the first release.
    "ALTER TABLE lakefold.late_events ADD COLUMN IF NOT EXISTS kind text NOT NULL "
    "DEFAULT 'window'",
    # The generation that found the event late (0: a row from before generations were kept)
    # and the event's stream; added after the first release.
    "ALTER TABLE lakefold.late_events ADD COLUMN IF NOT EXISTS generation integer NOT NULL "
    "DEFAULT 0, ADD COLUMN IF NOT EXISTS stream_id text",
    """DO $$ BEGIN
        IF NOT EXISTS (SELECT FROM pg_index i JOIN pg_attribute a
                       ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
                       WHERE i.indrelid = 'lakefold.late_events'::regclass AND i.indisprimary
                       AND a.attname = 'generation') THEN
            ALTER TABLE lakefold.late_events DROP CONSTRAINT late_events_pkey;
            ALTER TABLE lakefold.late_events
                ADD PRIMARY KEY (view, generation, input, position, window_start);
        END IF;
    END $$""",
    """CREATE INDEX IF NOT EXISTS late_events_streams ON lakefold.late_events
        (view, generation, input, stream_id)""",
]
COMPONENT: Final = migrations.register("late_events",
                                       Migration(1, "late events", *_DDL))
#: Namespace of the per-view lock that orders replays with the feeds that fold them.
_REPLAY_LOCK: Final = 0x6C66_4C52  # "lfLR"


@dataclass(frozen=True)
class LateEvent:
    """One event a window did not count (see the module docstring)."""

    view: str
    input: str
    position: int
    window_start: datetime
    window_end: datetime
    event_time: datetime
    watermark: datetime
    late_by_seconds: float
    status: str
    recorded_at: datetime
    replayed_at: datetime | None

    def as_json(self) -> dict[str, Any]:
        return {k: v.isoformat() if isinstance(v, datetime) else v
                for k, v in self.__dict__.items()}


def install_late_events(conn: psycopg.Connection[Any]) -> None:
    """Create the late-events table (idempotent, concurrency-safe)."""
    migrations.migrate(conn, COMPONENT)


def _times(micros: np.ndarray) -> list[datetime]:
    from datetime import timedelta

    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return [epoch + timedelta(microseconds=int(m)) for m in micros]


def record_late(conn: psycopg.Connection[Any], view: str, generation: int, input_name: str,
                positions: np.ndarray, starts: np.ndarray, size_us: int | np.ndarray,
                times: np.ndarray, watermarks: np.ndarray, *, kind: str = "window",
                streams: Sequence[str | None] | None = None) -> set[tuple[int, int]]:
    """Record late (event, window) pairs of a generation in the caller's transaction (a pair
    it recorded before stays as it is; ``streams``: each event's stream). Returns the pairs
    among them that were replayed (in any generation): those count in their windows, and
    are recorded as replayed. ``kind``: what the event was late for (see the table's DDL)."""
    if not len(positions):
        return set()
    found = conn.execute(
        "SELECT DISTINCT position, (extract(epoch FROM window_start) * 1000000)::bigint "
        "FROM lakefold.late_events WHERE view = %s AND input = %s AND status = 'replayed' "
        "AND position = ANY(%s)", (view, input_name, sorted(set(positions.tolist())))).fetchall()
    replayed = {(int(p), int(s)) for p, s in found}
    ends = starts + size_us
    rows = list(zip(positions.tolist(), starts.tolist(), _times(starts), _times(ends),
                    _times(times), _times(watermarks), ((watermarks - ends) / 1e6).tolist(),
                    streams if streams is not None else [None] * len(positions),
                    strict=True))
    now = datetime.now(UTC)
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO lakefold.late_events (view, generation, input, position, "
            "window_start, window_end, event_time, watermark, late_by, kind, stream_id, "
            "status, replayed_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, "
            "make_interval(secs => %s), %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            [(view, generation, input_name, position, *row, kind, stream,
              "replayed" if (position, start) in replayed else "late",
              now if (position, start) in replayed else None)
             for position, start, *row, stream in rows])
    return replayed


def forget_late_streams(conn: psycopg.Connection[Any], view: str, generation: int,
                        input_name: str, streams: Sequence[str]) -> int:
    """Delete a generation's late rows of the events of deleted ``streams`` (they left the
    view, as they never enter a rebuild's); returns how many went."""
    if not streams:
        return 0
    return conn.execute(
        "DELETE FROM lakefold.late_events WHERE view = %s AND generation = %s AND input = %s "
        "AND stream_id = ANY(%s)", (view, generation, input_name, list(streams))).rowcount


def forget_late_generation(conn: psycopg.Connection[Any], view: str, generation: int) -> None:
    """Delete a retired generation's late rows."""
    conn.execute("DELETE FROM lakefold.late_events WHERE view = %s AND generation = %s",
                 (view, generation))


def pending_replays(conn: psycopg.Connection[Any], view: str, generation: int,
                    input_name: str, after_seq: int) -> tuple[list[tuple[int, int]], int]:
    """A generation's replayed (position, window start in microseconds) pairs with a replay
    number after ``after_seq``, and the largest replay number among them. Waits for a replay
    being made (and holds replays off until the caller's transaction ends), so a replay
    number is never read past before the replay that takes it commits."""
    _replay_lock(conn, view)
    rows = conn.execute(
        "SELECT position, (extract(epoch FROM window_start) * 1000000)::bigint, replay_seq "
        "FROM lakefold.late_events WHERE view = %s AND generation IN (0, %s) AND input = %s "
        "AND status = 'replayed' AND replay_seq > %s ORDER BY replay_seq",
        (view, generation, input_name, after_seq)).fetchall()
    return [(int(p), int(s)) for p, s, _ in rows], max((int(r[2]) for r in rows),
                                                       default=after_seq)


def list_late(conn: psycopg.Connection[Any], view: str, *, status: str | None = None,
              limit: int = 100) -> list[LateEvent]:
    """A view's late events, the latest recorded first."""
    install_late_events(conn)
    rows = conn.execute(
        "SELECT view, input, position, window_start, window_end, event_time, watermark, "
        "late_by, status, recorded_at, replayed_at FROM (SELECT DISTINCT ON (input, position, "
        " window_start) view, input, position, window_start, window_end, event_time, "
        " watermark, extract(epoch FROM late_by)::float8 AS late_by, status, recorded_at, "
        " replayed_at FROM lakefold.late_events WHERE view = %s "
        " ORDER BY input, position, window_start, generation DESC) l "
        "WHERE (%s::text IS NULL OR status = %s) "
        "ORDER BY recorded_at DESC, position DESC, window_start LIMIT %s",
        (view, status, status, limit)).fetchall()
    return [LateEvent(*row) for row in rows]


def late_events(store_dsn: str, view: str, *, status: str | None = None,
                limit: int = 100) -> list[LateEvent]:
    """``list_late`` on a connection of its own (for the command line)."""
    if status not in (None, "late", "replayed"):
        raise ProjectionDefinitionError(
            f"--status {status!r}: a late event is 'late' or 'replayed'")
    with psycopg.connect(store_dsn, autocommit=True) as conn:
        return list_late(conn, view, status=status, limit=limit)


def replay_late_events(store_dsn: str, view: str,
                       positions: Sequence[int] | None = None) -> int:
    """``replay_late`` on a connection of its own (for the command line)."""
    with psycopg.connect(store_dsn, autocommit=True) as conn:
        return replay_late(conn, view, positions)


def count_late(conn: psycopg.Connection[Any], view: str) -> int:
    """How many of a view's (event, window) pairs are late and not replayed."""
    row = conn.execute(
        "SELECT count(*) FROM (SELECT DISTINCT ON (input, position, window_start) status "
        "FROM lakefold.late_events WHERE view = %s "
        "ORDER BY input, position, window_start, generation DESC) l WHERE status = 'late'",
        (view,)).fetchone()
    return int(row[0]) if row else 0


def replay_late(conn: psycopg.Connection[Any], view: str,
                positions: Sequence[int] | None = None) -> int:
    """Mark a view's late events (all, or those at ``positions``) to be folded back into
    their windows; returns how many were marked (already replayed ones are left)."""
    install_late_events(conn)
    with conn.transaction():
        _replay_lock(conn, view)
        found = conn.execute("SELECT kind FROM lakefold.late_events WHERE view = %s AND "
                             "kind <> 'window' LIMIT 1", (view,)).fetchone()
        if found is not None:
            what, why = {
                "join": ("interval join", "the events it would have joined may be forgotten "
                         "already"),
                "session": ("session windows", "it would merge sessions already final"),
            }.get(found[0], ("windowed table", "the row may have changed since"))
            raise ProjectionDefinitionError(
                f"view {view}: a late event of its {what} cannot be folded back in, because "
                f"{why}; rebuild the view with a larger allowed lateness (lateness=...) to "
                "count it")
        rows = conn.execute(
            "UPDATE lakefold.late_events SET status = 'replayed', replayed_at = now(), "
            "replay_seq = nextval('lakefold.late_event_replay_seq') "
            "WHERE view = %s AND status = 'late' AND (%s::bigint[] IS NULL "
            "OR position = ANY(%s::bigint[])) RETURNING position",
            (view, None if positions is None else list(positions),
             None if positions is None else list(positions))).fetchall()
    return len(rows)


def _replay_lock(conn: psycopg.Connection[Any], view: str) -> None:
    conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_REPLAY_LOCK, view))
