"""The projection catalog in PostgreSQL (schema ``lakefold``): names, generations, sink
locations, pause state, batch progress, and status.

Guarantees:

- Each projection NAME points at exactly one *current* generation. ``switch`` moves the pointer
  in one transaction, so a reader resolving NAME sees the old generation or the new one, never
  a mix, and never a generation that is still being built.
- A generation's sink locations (Delta path, Redis key prefix, index directory, Spark
  checkpoint directory) are fixed when it is created and never shared with another generation.
- At most one generation per NAME is being built at a time.
- Batch progress is informational (status, lag, the rebuild's catch-up test); the exactly-once
  effect comes from each target's own checkpoint, written with its data.

Dead letters live next to these tables, in ``_deadletters.py``.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import psycopg.errors
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from lakefold.core import migrations
from lakefold.core.dsn import connection_problem, mask_dsn
from lakefold.core.migrations import Migration, SchemaMigrationError
from lakefold.projections.exceptions import (
    CatalogUnavailableError,
    ProjectionNotFoundError,
    ProjectionStateError,
)

SCHEMA = "lakefold"
_BATCHES_KEPT = 500  # per generation, for throughput figures
#: Advisory lock (namespace, key) held by the process running a generation's query.
LOCK_NAMESPACE = zlib.crc32(b"lakefold.projection") & 0x7FFF_FFFF


def generation_lock_key(name: str, generation: int) -> int:
    """The advisory lock key of one generation (with ``LOCK_NAMESPACE``)."""
    return zlib.crc32(f"{name}:{generation}".encode()) & 0x7FFF_FFFF


def hold_generation(dsn: str, name: str, generation: int) -> psycopg.Connection[Any] | None:
    """A connection of its own holding the generation's advisory lock while it stays open (the
    lock goes with the process, even on SIGKILL); None when another process holds it."""
    conn = psycopg.connect(dsn, autocommit=True)
    try:
        row = conn.execute("SELECT pg_try_advisory_lock(%s, %s)",
                           (LOCK_NAMESPACE, generation_lock_key(name, generation))).fetchone()
    except BaseException:
        conn.close()
        raise
    if not (row and row[0]):
        conn.close()
        return None
    return conn


def still_holds(conn: psycopg.Connection[Any], name: str, generation: int) -> bool:
    """True when ``conn`` (from ``hold_generation``) still holds the generation's lock; False
    when its session ended (the server restarted, or the session was terminated): the lock
    went with it."""
    if conn.closed:
        return False
    try:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
            "AND pid = pg_backend_pid() AND classid = %s AND objid = %s AND objsubid = 2 "
            "AND granted", (LOCK_NAMESPACE, generation_lock_key(name, generation))).fetchone()
    except psycopg.Error:
        return False
    return bool(row and row[0])

_DDL = [
    "CREATE SCHEMA IF NOT EXISTS lakefold",
    """CREATE TABLE IF NOT EXISTS lakefold.projections (
        name text PRIMARY KEY,
        target_kind text NOT NULL,
        current_generation integer NOT NULL,
        paused boolean NOT NULL DEFAULT false,
        state text NOT NULL DEFAULT 'idle',
        last_error text,
        fingerprint text,
        keep_generations integer NOT NULL DEFAULT 1,
        created_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz NOT NULL DEFAULT now())""",
    """CREATE TABLE IF NOT EXISTS lakefold.projection_generations (
        name text NOT NULL REFERENCES lakefold.projections ON DELETE CASCADE,
        generation integer NOT NULL,
        status text NOT NULL,
        locations jsonb NOT NULL,
        checkpoint_dir text NOT NULL,
        scope jsonb,
        position jsonb NOT NULL DEFAULT '{}',
        batch_id bigint,
        rows_total bigint NOT NULL DEFAULT 0,
        last_batch_at timestamptz,
        created_at timestamptz NOT NULL DEFAULT now(),
        switched_at timestamptz,
        PRIMARY KEY (name, generation),
        CHECK (status IN ('building', 'live', 'retired', 'dropped', 'abandoned')))""",
    "ALTER TABLE lakefold.projections ADD COLUMN IF NOT EXISTS definition jsonb",
    # Catalogs from before target kinds were open kept one column per kind: fold them into
    # ``locations`` (kind → location), which a new kind of target extends without a column.
    """DO $$ BEGIN
        IF EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = 'lakefold'
                   AND table_name = 'projection_generations' AND column_name = 'delta_path')
        THEN
            ALTER TABLE lakefold.projection_generations ADD COLUMN IF NOT EXISTS locations jsonb;
            UPDATE lakefold.projection_generations SET locations = jsonb_build_object(
                'delta', delta_path, 'redis', redis_prefix, 'search', index_dir)
                WHERE locations IS NULL;
            ALTER TABLE lakefold.projection_generations
                ALTER COLUMN locations SET NOT NULL, DROP COLUMN delta_path,
                DROP COLUMN redis_prefix, DROP COLUMN index_dir;
        END IF;
    END $$""",
    """CREATE UNIQUE INDEX IF NOT EXISTS projection_generations_one_building
        ON lakefold.projection_generations (name) WHERE status = 'building'""",
    """CREATE TABLE IF NOT EXISTS lakefold.projection_batches (
        name text NOT NULL,
        generation integer NOT NULL,
        batch_id bigint NOT NULL,
        end_position jsonb NOT NULL,
        rows bigint NOT NULL,
        committed_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (name, generation, batch_id),
        FOREIGN KEY (name, generation)
            REFERENCES lakefold.projection_generations ON DELETE CASCADE)""",
]
#: Errors counted where they happen (``set_state``), so that they survive the console.
_ERRORS_TOTAL = ("ALTER TABLE lakefold.projections ADD COLUMN IF NOT EXISTS errors_total bigint "
                 "NOT NULL DEFAULT 0")
COMPONENT = migrations.register(
    "catalog", Migration(1, "projections, generations, batches", *_DDL),
    Migration(2, "projections.errors_total", _ERRORS_TOTAL))


@dataclass(frozen=True)
class SinkRoots:
    """Where new generations put their sinks: ``lake``/NAME/gN for Delta, ``search``/NAME/gN
    for indexes, ``checkpoints``/NAME/gN for Spark, ``redis_namespace``:NAME:gN: for keys.
    ``lake`` is a local directory or an object store URI (``s3://bucket/prefix``); with the
    lake on a bucket, ``checkpoints`` is there too (``s3a://bucket/prefix/_checkpoints``: Spark
    writes them through Hadoop's S3A, whose scheme is ``s3a``)."""

    lake: Path | str
    search: Path
    checkpoints: Path | str
    redis_namespace: str = "lf"

    @classmethod
    def under(cls, home: Path, lake: Path | str | None = None) -> SinkRoots:
        if isinstance(lake, str) and "://" in lake:
            from lakefold.spark.internals import checkpoint_root

            root = lake.rstrip("/")
            return cls(lake=root, search=(home / "search").resolve(),
                       checkpoints=checkpoint_root(root))
        return cls(lake=Path(lake or home / "lake").resolve(), search=(home / "search").resolve(),
                   checkpoints=(home / "checkpoints").resolve())

    def checkpoint(self, name: str, generation: int) -> str:
        """Spark's checkpoint directory of generation ``generation`` of NAME."""
        if isinstance(self.checkpoints, str):
            return f"{self.checkpoints}/{name}/g{generation}"
        return str(self.checkpoints / name / f"g{generation}")

    def locations(self, name: str, generation: int) -> dict[str, str]:
        """Target kind → where generation ``generation`` of NAME keeps its storage."""
        tag = f"g{generation}"
        delta = f"{self.lake}/{name}/{tag}" if isinstance(self.lake, str) \
            else str(self.lake / name / tag)
        return {"delta": delta,
                "redis": f"{self.redis_namespace}:{name}:{tag}:",
                "search": str(self.search / name / tag)}


@dataclass(frozen=True)
class Generation:
    """One generation of a projection and its private sink locations: one per target kind
    (``location``), and Spark's checkpoint directory."""

    name: str
    generation: int
    status: str
    locations: Mapping[str, str]
    checkpoint_dir: str
    scope: dict[str, Any] | None
    position: dict[str, int]
    batch_id: int | None
    rows_total: int
    last_batch_at: datetime | None
    created_at: datetime
    switched_at: datetime | None

    def location(self, kind: str) -> str:
        """Where this generation keeps the storage of a ``kind`` target (a Delta table's
        path, a Redis key prefix, an index directory)."""
        try:
            return self.locations[kind]
        except KeyError:
            raise ProjectionStateError(
                f"generation {self.generation} of {self.name} has no location for a {kind} "
                f"target (known kinds: {', '.join(sorted(self.locations))})"
            ) from None


@dataclass(frozen=True)
class ProjectionRow:
    """A projection's catalog entry."""

    name: str
    target_kind: str
    current_generation: int
    paused: bool
    state: str
    last_error: str | None
    fingerprint: str | None
    keep_generations: int
    updated_at: datetime
    #: Errors it ran into (each time it went ``retrying`` or ``failed`` with an error).
    errors_total: int = 0


def redis_pointer_key(namespace: str, name: str) -> str:
    """The Redis key that mirrors NAME's current generation for cache readers."""
    return f"{namespace}:{name}:current"


class Catalog:
    """The catalog on one PostgreSQL database; thread-safe (one connection behind a lock)."""

    def __init__(self, dsn: str, roots: SinkRoots | None = None) -> None:
        self.dsn = dsn
        self.roots = roots
        self._lock = threading.RLock()
        self._connection: psycopg.Connection[dict[str, Any]] | None = None

    # ------------------------------------------------------------------ connection

    @contextmanager
    def _tx(self) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        """A transaction on the catalog connection; connection loss becomes
        CatalogUnavailableError (transient) and the connection is reopened next time."""
        with self._lock:
            try:
                if self._connection is None or self._connection.closed:
                    self._connection = psycopg.connect(
                        self.dsn, autocommit=True, row_factory=dict_row, connect_timeout=10
                    )
                with self._connection.transaction():
                    yield self._connection
            except psycopg.errors.UndefinedTable as e:
                raise ProjectionNotFoundError(
                    f"the projection catalog is not installed in {mask_dsn(self.dsn)}; "
                    "run the projections once with `lakefold run`"
                ) from e
            except psycopg.errors.UndefinedColumn as e:
                raise SchemaMigrationError(
                    f"the projection catalog in {mask_dsn(self.dsn)} is older than this "
                    f"lakefold ({str(e).splitlines()[0]}); run `lakefold run` or "
                    "`lakefold console` of this version once: it migrates the catalog"
                ) from e
            except psycopg.OperationalError as e:
                if self._connection is not None:
                    self._connection.close()
                self._connection = None
                raise CatalogUnavailableError(
                    f"cannot connect to the projection catalog at {mask_dsn(self.dsn)}: "
                    f"{connection_problem(e, self.dsn)}"
                ) from e

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def install(self) -> None:
        """Create the catalog tables if they are missing (idempotent, concurrency-safe)."""
        with self._tx() as conn:
            migrations.migrate(conn, COMPONENT)

    # ------------------------------------------------------------------ projections

    def _locations(self, name: str, generation: int) -> tuple[Jsonb, str]:
        """A new generation's storage locations (kind → location) and its checkpoint
        directory."""
        if self.roots is None:
            raise ProjectionStateError(
                "this catalog was opened without sink roots; pass SinkRoots to create generations"
            )
        return (Jsonb(self.roots.locations(name, generation)),
                self.roots.checkpoint(name, generation))

    def ensure(self, name: str, *, target_kind: str, fingerprint: str,
               keep_generations: int, definition: dict[str, Any] | None = None
               ) -> ProjectionRow:
        """Register NAME with generation 1 (live) if it is new; otherwise refresh its
        definition (and fingerprint) and retention. Returns the catalog entry."""
        with self._tx() as conn:
            row = conn.execute(
                "SELECT * FROM lakefold.projections WHERE name = %s FOR UPDATE", (name,)
            ).fetchone()
            if row is None:
                locations, checkpoint = self._locations(name, 1)
                conn.execute(
                    "INSERT INTO lakefold.projections (name, target_kind, current_generation, "
                    "fingerprint, keep_generations, definition) VALUES (%s, %s, 1, %s, %s, %s) "
                    "ON CONFLICT (name) DO NOTHING",
                    (name, target_kind, fingerprint, keep_generations, Jsonb(definition)),
                )
                conn.execute(
                    "INSERT INTO lakefold.projection_generations (name, generation, status, "
                    "locations, checkpoint_dir, switched_at) "
                    "VALUES (%s, 1, 'live', %s, %s, now()) ON CONFLICT DO NOTHING",
                    (name, locations, checkpoint),
                )
            else:
                conn.execute(
                    "UPDATE lakefold.projections SET target_kind = %s, fingerprint = %s, "
                    "keep_generations = %s, definition = %s, updated_at = now() "
                    "WHERE name = %s",
                    (target_kind, fingerprint, keep_generations, Jsonb(definition), name),
                )
            return self._projection(conn, name)

    @staticmethod
    def _projection(conn: psycopg.Connection[dict[str, Any]], name: str) -> ProjectionRow:
        row = conn.execute("SELECT name, target_kind, current_generation, paused, state, "
                           "last_error, fingerprint, keep_generations, updated_at, "
                           "errors_total FROM lakefold.projections WHERE name = %s",
                           (name,)).fetchone()
        if row is None:
            raise ProjectionNotFoundError(
                f"projection {name!r} is not in the catalog; run it once with `lakefold run`"
            )
        return ProjectionRow(**row)

    def projection(self, name: str) -> ProjectionRow:
        with self._tx() as conn:
            return self._projection(conn, name)

    def definition(self, name: str) -> dict[str, Any] | None:
        """The definition NAME was last run with (``Projection.describe()``)."""
        with self._tx() as conn:
            row = conn.execute("SELECT definition FROM lakefold.projections WHERE name = %s",
                               (name,)).fetchone()
        return None if row is None else row["definition"]

    def projections(self) -> list[ProjectionRow]:
        with self._tx() as conn:
            rows = conn.execute("SELECT name, target_kind, current_generation, paused, state, "
                                "last_error, fingerprint, keep_generations, updated_at, "
                                "errors_total FROM lakefold.projections ORDER BY name"
                                ).fetchall()
        return [ProjectionRow(**row) for row in rows]

    def set_state(self, name: str, state: str, *, error: str | None = None,
                  keep_error: bool = False) -> None:
        """Record NAME's runtime state (running, paused, rebuilding, retrying, failed,
        stopped). A ``retrying`` or ``failed`` state with an ``error`` counts one error in
        ``errors_total`` (every time: the same error twice is two errors)."""
        counted = int(not keep_error and error is not None and state in ("retrying", "failed"))
        with self._tx() as conn:
            if keep_error:
                conn.execute("UPDATE lakefold.projections SET state = %s, updated_at = now() "
                             "WHERE name = %s", (state, name))
            else:
                conn.execute("UPDATE lakefold.projections SET state = %s, last_error = %s, "
                             "errors_total = errors_total + %s, updated_at = now() "
                             "WHERE name = %s", (state, error, counted, name))

    def set_paused(self, name: str, paused: bool) -> ProjectionRow:
        """Pause or resume NAME; a running runner stops or restarts its queries within one
        poll interval. Progress is kept: resume continues from the checkpoint."""
        with self._tx() as conn:
            self._projection(conn, name)
            conn.execute("UPDATE lakefold.projections SET paused = %s, updated_at = now() "
                         "WHERE name = %s", (paused, name))
            return self._projection(conn, name)

    # ------------------------------------------------------------------ generations

    @staticmethod
    def _generation(row: dict[str, Any]) -> Generation:
        return Generation(**row)

    def generation(self, name: str, generation: int) -> Generation:
        with self._tx() as conn:
            row = conn.execute(
                "SELECT * FROM lakefold.projection_generations WHERE name = %s "
                "AND generation = %s", (name, generation)).fetchone()
        if row is None:
            raise ProjectionNotFoundError(f"projection {name!r} has no generation {generation}")
        return self._generation(row)

    def current(self, name: str) -> Generation:
        """NAME's current (live) generation: what readers see."""
        with self._tx() as conn:
            row = conn.execute(
                "SELECT g.* FROM lakefold.projections p JOIN lakefold.projection_generations g "
                "ON g.name = p.name AND g.generation = p.current_generation WHERE p.name = %s",
                (name,)).fetchone()
        if row is None:
            raise ProjectionNotFoundError(
                f"projection {name!r} is not in the catalog; run it once with `lakefold run`"
            )
        return self._generation(row)

    def generations(self, name: str) -> list[Generation]:
        with self._tx() as conn:
            rows = conn.execute("SELECT * FROM lakefold.projection_generations WHERE name = %s "
                                "ORDER BY generation", (name,)).fetchall()
        return [self._generation(row) for row in rows]

    def building(self, name: str) -> Generation | None:
        """The generation being rebuilt for NAME, if any."""
        with self._tx() as conn:
            row = conn.execute("SELECT * FROM lakefold.projection_generations WHERE name = %s "
                               "AND status = 'building'", (name,)).fetchone()
        return None if row is None else self._generation(row)

    def begin_rebuild(self, name: str, *, scope: dict[str, Any] | None = None) -> Generation:
        """Create generation N+1 (status ``building``) with fresh sink locations. Refused
        while another rebuild of NAME is in progress."""
        with self._tx() as conn:
            self._projection(conn, name)
            conn.execute("SELECT 1 FROM lakefold.projections WHERE name = %s FOR UPDATE",
                         (name,))
            busy = conn.execute("SELECT generation FROM lakefold.projection_generations "
                                "WHERE name = %s AND status = 'building'", (name,)).fetchone()
            if busy is not None:
                raise ProjectionStateError(
                    f"projection {name} is already being rebuilt into generation "
                    f"{busy['generation']}; wait for it, or abandon it with "
                    f"`lakefold rebuild {name} --abandon`"
                )
            (top,) = conn.execute("SELECT max(generation) AS g FROM "
                                  "lakefold.projection_generations WHERE name = %s",
                                  (name,)).fetchone().values()  # type: ignore[union-attr]
            generation = int(top) + 1
            locations, checkpoint = self._locations(name, generation)
            row = conn.execute(
                "INSERT INTO lakefold.projection_generations (name, generation, status, "
                "locations, checkpoint_dir, scope) "
                "VALUES (%s, %s, 'building', %s, %s, %s) RETURNING *",
                (name, generation, locations, checkpoint,
                 Jsonb(scope) if scope is not None else None),
            ).fetchone()
            assert row is not None  # noqa: S101 - RETURNING always yields the row
            return self._generation(row)

    def abandon(self, name: str, generation: int) -> None:
        """Give up a generation that is being built; its sinks are dropped like retired ones."""
        with self._tx() as conn:
            conn.execute("UPDATE lakefold.projection_generations SET status = 'abandoned' "
                         "WHERE name = %s AND generation = %s AND status = 'building'",
                         (name, generation))

    def switch(self, name: str, generation: int) -> list[Generation]:
        """Atomically make ``generation`` NAME's current one; the previous one is retired.

        Returns the generations whose sinks may now be dropped: every retired or abandoned one
        beyond the newest ``keep_generations`` retired ones.
        """
        return self.switch_together({name: generation})

    def switch_together(self, generations: Mapping[str, int]) -> list[Generation]:
        """``switch`` several projections in one transaction (a view and the views that read
        it: a reader never sees one switched without the others)."""
        dropped: list[Generation] = []
        with self._tx() as conn:
            for name, generation in sorted(generations.items()):
                dropped += self._switch(conn, name, generation)
        return dropped

    def _switch(self, conn: psycopg.Connection[dict[str, Any]], name: str,
                generation: int) -> list[Generation]:
        entry = conn.execute("SELECT * FROM lakefold.projections WHERE name = %s FOR UPDATE",
                             (name,)).fetchone()
        if entry is None:
            raise ProjectionNotFoundError(f"projection {name!r} is not in the catalog")
        target = conn.execute("SELECT status FROM lakefold.projection_generations "
                              "WHERE name = %s AND generation = %s",
                              (name, generation)).fetchone()
        if target is None or target["status"] != "building":
            raise ProjectionStateError(
                f"projection {name}: generation {generation} is not being built "
                f"(status {target['status'] if target else 'missing'}); cannot switch to it"
            )
        conn.execute("UPDATE lakefold.projection_generations SET status = 'retired' "
                     "WHERE name = %s AND generation = %s",
                     (name, entry["current_generation"]))
        conn.execute("UPDATE lakefold.projection_generations SET status = 'live', "
                     "switched_at = now() WHERE name = %s AND generation = %s",
                     (name, generation))
        conn.execute("UPDATE lakefold.projections SET current_generation = %s, "
                     "updated_at = now() WHERE name = %s", (generation, name))
        return self._droppable(conn, name, int(entry["keep_generations"]))

    def _droppable(self, conn: psycopg.Connection[dict[str, Any]], name: str,
                   keep: int) -> list[Generation]:
        """NAME's abandoned generations and its retired ones beyond the newest ``keep``."""
        rows = conn.execute(
            "SELECT * FROM lakefold.projection_generations WHERE name = %s AND ("
            "status = 'abandoned' OR (status = 'retired' AND generation NOT IN ("
            "SELECT generation FROM lakefold.projection_generations WHERE name = %s "
            "AND status = 'retired' ORDER BY generation DESC LIMIT %s)))",
            (name, name, keep)).fetchall()
        return [self._generation(row) for row in rows]

    def droppable(self, name: str) -> list[Generation]:
        """Generations whose sinks should be dropped now (see ``switch``)."""
        with self._tx() as conn:
            keep = conn.execute("SELECT keep_generations FROM lakefold.projections "
                                "WHERE name = %s", (name,)).fetchone()
            if keep is None:
                return []
            return self._droppable(conn, name, int(keep["keep_generations"]))

    def mark_dropped(self, name: str, generation: int) -> None:
        with self._tx() as conn:
            conn.execute("UPDATE lakefold.projection_generations SET status = 'dropped' "
                         "WHERE name = %s AND generation = %s", (name, generation))
            conn.execute("DELETE FROM lakefold.projection_batches WHERE name = %s "
                         "AND generation = %s", (name, generation))

    # ------------------------------------------------------------------ progress

    def record_batch(self, name: str, generation: int, batch_id: int,
                     end_position: dict[str, int], rows: int) -> None:
        """Note that ``batch_id`` of a generation is in its sinks (idempotent on replay)."""
        with self._tx() as conn:
            inserted = conn.execute(
                "INSERT INTO lakefold.projection_batches (name, generation, batch_id, "
                "end_position, rows) VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (name, generation, batch_id, Jsonb(end_position), rows)).rowcount
            conn.execute(
                "UPDATE lakefold.projection_generations SET position = %s, batch_id = %s, "
                "rows_total = rows_total + %s, last_batch_at = now() "
                "WHERE name = %s AND generation = %s AND coalesce(batch_id, -1) <= %s",
                (Jsonb(end_position), batch_id, rows if inserted else 0, name, generation,
                 batch_id))
            if batch_id % 50 == 0:
                conn.execute(
                    "DELETE FROM lakefold.projection_batches WHERE name = %s AND generation = %s "
                    "AND batch_id < %s", (name, generation, batch_id - _BATCHES_KEPT))

    def throughput(self, name: str, generation: int, *, window_seconds: float = 60.0) -> float:
        """Records per second over the last ``window_seconds`` of committed batches."""
        with self._tx() as conn:
            row = conn.execute(
                "SELECT coalesce(sum(rows), 0) AS rows FROM lakefold.projection_batches "
                "WHERE name = %s AND generation = %s "
                "AND committed_at > now() - make_interval(secs => %s)",
                (name, generation, window_seconds)).fetchone()
        return float(row["rows"]) / window_seconds if row else 0.0

    def recent_batches(self, name: str, *, limit: int = 20) -> list[dict[str, Any]]:
        """The last ``limit`` committed batches of NAME's generations, newest first: the
        generation, batch id, commit time, records and end position of each (the catalog
        keeps the last ones of each generation)."""
        with self._tx() as conn:
            return list(conn.execute(
                "SELECT generation, batch_id, committed_at, rows, end_position "
                "FROM lakefold.projection_batches WHERE name = %s "
                "ORDER BY committed_at DESC, generation DESC, batch_id DESC LIMIT %s",
                (name, limit)).fetchall())

    def forget(self, name: str) -> None:
        """Remove NAME and all its generations from the catalog (sinks are not touched)."""
        with self._tx() as conn:
            conn.execute(sql.SQL("DELETE FROM {}.projections WHERE name = %s").format(
                sql.Identifier(SCHEMA)), (name,))
