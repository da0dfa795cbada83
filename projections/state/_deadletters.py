"""Dead letters: records (or output rows) that failed every retry, kept with their error.

A dead letter is identified by (projection, generation, ref): ``ref`` names the failed thing
(``fold:<source>:<position>``, ``transform:<source>:<position>`` or ``target:<key>``), so a
batch that is replayed after a crash records the same dead letter once.

Life cycle: ``open`` → ``retry`` (``lakefold dlq retry``; the runner feeds it through the
projection again at its next batch) → ``resolved``, or back to ``open`` with one more attempt
and the new error; ``open`` → ``dropped`` (``lakefold dlq drop``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from lakefold.core import migrations
from lakefold.core.migrations import Migration
from lakefold.projections.exceptions import ProjectionStateError
from lakefold.projections.state._catalog import Catalog

_DDL = [
    """CREATE TABLE IF NOT EXISTS lakefold.projection_dead_letters (
        id bigserial PRIMARY KEY,
        name text NOT NULL,
        generation integer NOT NULL,
        ref text NOT NULL,
        stage text NOT NULL,
        source text NOT NULL,
        position bigint NOT NULL,
        record jsonb NOT NULL,
        error text NOT NULL,
        attempts integer NOT NULL,
        status text NOT NULL DEFAULT 'open'
            CHECK (status IN ('open', 'retry', 'resolved', 'dropped')),
        retry_seq bigint,
        created_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz NOT NULL DEFAULT now(),
        UNIQUE (name, generation, ref))""",
    # The stages a dead letter comes from; 'view' (a partition a view's query failed on) was
    # added after the first release, so the check is replaced rather than created with the
    # table.
    """ALTER TABLE lakefold.projection_dead_letters
        DROP CONSTRAINT IF EXISTS projection_dead_letters_stage_check,
        ADD CONSTRAINT projection_dead_letters_stage_check
            CHECK (stage IN ('fold', 'transform', 'target', 'view'))""",
    "CREATE SEQUENCE IF NOT EXISTS lakefold.projection_dead_letter_retry_seq",
    """CREATE INDEX IF NOT EXISTS projection_dead_letters_retry
        ON lakefold.projection_dead_letters (name, generation, retry_seq)
        WHERE status = 'retry'""",
]
COMPONENT = migrations.register(
    "dead_letters", Migration(1, "projection dead letters", *_DDL))


@dataclass(frozen=True)
class DeadLetter:
    """A failed record: what it was, where it came from, the last error, how often it failed."""

    id: int
    name: str
    generation: int
    ref: str
    stage: str
    source: str
    position: int
    record: dict[str, Any]
    error: str
    attempts: int
    status: str
    retry_seq: int | None
    created_at: datetime
    updated_at: datetime

    def as_json(self) -> dict[str, Any]:
        return {**self.__dict__, "created_at": self.created_at.isoformat(),
                "updated_at": self.updated_at.isoformat()}


@dataclass(frozen=True)
class NewDeadLetter:
    """A dead letter to record (see ``DeadLetters.add``)."""

    ref: str
    stage: str
    source: str
    position: int
    record: dict[str, Any]
    error: str
    attempts: int


def add_dead_letters(conn: psycopg.Connection[Any], name: str, generation: int,
                     letters: list[NewDeadLetter]) -> int:
    """Record failed records in the caller's transaction; one already recorded (same ref)
    only gains the new error and attempts if it was waiting for a retry. Returns how many
    are new."""
    new = 0
    for letter in letters:
        row = conn.execute(
            "INSERT INTO lakefold.projection_dead_letters (name, generation, ref, stage, "
            "source, position, record, error, attempts) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (name, generation, ref) DO UPDATE SET "
            "  error = EXCLUDED.error, "
            "  attempts = projection_dead_letters.attempts + EXCLUDED.attempts, "
            "  status = 'open', retry_seq = NULL, updated_at = now() "
            "  WHERE projection_dead_letters.status = 'retry' "
            "RETURNING (xmax = 0) AS inserted",
            (name, generation, letter.ref, letter.stage, letter.source, letter.position,
             Jsonb(letter.record), letter.error, letter.attempts)).fetchone()
        inserted = row["inserted"] if isinstance(row, dict) else (row[0] if row else False)
        new += int(bool(inserted))
    return new


def install_dead_letters(conn: psycopg.Connection[Any]) -> None:
    """Create the dead-letter table (idempotent, concurrency-safe)."""
    migrations.migrate(conn, COMPONENT)


class DeadLetters:
    """The dead-letter table, on the catalog's connection."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog

    def install(self) -> None:
        with self._catalog._tx() as conn:
            install_dead_letters(conn)

    def add(self, name: str, generation: int, letters: list[NewDeadLetter]) -> int:
        """Record failed records (see ``add_dead_letters``). Returns how many are new."""
        if not letters:
            return 0
        with self._catalog._tx() as conn:
            return add_dead_letters(conn, name, generation, letters)

    def find(self, name: str | None = None, *, status: str | None = None,
             limit: int = 100) -> list[DeadLetter]:
        """Dead letters, newest first, optionally of one projection and one status."""
        with self._catalog._tx() as conn:
            rows = conn.execute(
                "SELECT * FROM lakefold.projection_dead_letters WHERE "
                "(%(name)s::text IS NULL OR name = %(name)s) AND "
                "(%(status)s::text IS NULL OR status = %(status)s) "
                "ORDER BY id DESC LIMIT %(limit)s",
                {"name": name, "status": status, "limit": limit}).fetchall()
        return [DeadLetter(**row) for row in rows]

    def get(self, letter_id: int) -> DeadLetter | None:
        """One dead letter by id, or None."""
        with self._catalog._tx() as conn:
            row = conn.execute("SELECT * FROM lakefold.projection_dead_letters WHERE id = %s",
                               (letter_id,)).fetchone()
        return None if row is None else DeadLetter(**row)

    def count_open(self, name: str) -> int:
        with self._catalog._tx() as conn:
            row = conn.execute("SELECT count(*) AS n FROM lakefold.projection_dead_letters "
                               "WHERE name = %s AND status IN ('open', 'retry')",
                               (name,)).fetchone()
        return int(row["n"]) if row else 0

    def request_retry(self, ids: list[int]) -> list[DeadLetter]:
        """Queue dead letters for another attempt (only open ones; others are an error)."""
        return self._transition(ids, "retry", "open")

    def drop(self, ids: list[int]) -> list[DeadLetter]:
        """Give up on dead letters: they stay listed as dropped and are never retried."""
        return self._transition(ids, "dropped", "open")

    def _transition(self, ids: list[int], to: str, allowed_from: str) -> list[DeadLetter]:
        if not ids:
            raise ProjectionStateError("name at least one dead-letter id (see `lakefold dlq list`)")
        with self._catalog._tx() as conn:
            rows = conn.execute("SELECT id, status FROM lakefold.projection_dead_letters "
                                "WHERE id = ANY(%s) FOR UPDATE", (ids,)).fetchall()
            found = {row["id"]: row["status"] for row in rows}
            missing: list[int] = sorted(set(ids) - set(found))
            if missing:
                raise ProjectionStateError(
                    f"no dead letter with id {', '.join(map(str, missing))}; "
                    "see `lakefold dlq list`"
                )
            wrong = sorted(i for i, s in found.items() if s != allowed_from)
            if wrong:
                raise ProjectionStateError(
                    f"dead letter {', '.join(map(str, wrong))} is "
                    f"{found[wrong[0]]}, not {allowed_from}; nothing was changed"
                )
            result = conn.execute(
                "UPDATE lakefold.projection_dead_letters SET status = %(to)s, updated_at = now(), "
                "retry_seq = CASE WHEN %(to)s = 'retry' "
                "  THEN nextval('lakefold.projection_dead_letter_retry_seq') END "
                "WHERE id = ANY(%(ids)s) RETURNING *", {"to": to, "ids": ids}).fetchall()
        return [DeadLetter(**row) for row in result]

    def pending_retries(self, name: str, generation: int, *, after_seq: int = 0,
                        up_to_seq: int | None = None) -> list[DeadLetter]:
        """Dead letters of one generation queued for retry, in retry order."""
        with self._catalog._tx() as conn:
            rows = conn.execute(
                "SELECT * FROM lakefold.projection_dead_letters WHERE name = %s "
                "AND generation = %s AND status = 'retry' AND retry_seq > %s "
                "AND (%s::bigint IS NULL OR retry_seq <= %s) ORDER BY retry_seq",
                (name, generation, after_seq, up_to_seq, up_to_seq)).fetchall()
        return [DeadLetter(**row) for row in rows]

    def resolve(self, ids: list[int]) -> None:
        """Mark retried dead letters as resolved (their record is now in the view)."""
        if not ids:
            return
        with self._catalog._tx() as conn:
            conn.execute("UPDATE lakefold.projection_dead_letters SET status = 'resolved', "
                         "updated_at = now() WHERE id = ANY(%s) AND status = 'retry'", (ids,))

    def retry_head(self, name: str, generation: int) -> int:
        """The highest retry sequence number queued for a generation (0 when none)."""
        with self._catalog._tx() as conn:
            row = conn.execute(
                "SELECT coalesce(max(retry_seq), 0) AS s FROM lakefold.projection_dead_letters "
                "WHERE name = %s AND generation = %s AND retry_seq IS NOT NULL",
                (name, generation)).fetchone()
        return int(row["s"]) if row else 0
