"""What a captured TRUNCATE does to a view (issue 18, item 5).

A truncate record (``_type`` ``truncate``, every column null; also written by ``lakefold
capture recover`` before its fresh snapshot) means "every row of the table so far is gone". It
is an ordered event: within a micro-batch, the stream's records before it are wiped and the
records after it apply. Each target applies it as follows:

- **Delta upsert, Redis, search** (a transform): the view's rows that came from the stream
  go. The source drops the stream's records up to the batch's last truncate (mode ``cut``), so
  the transform sees only what follows it, and the sink replaces the view's content with the
  batch in one step: a Delta merge that also deletes every row the batch does not name (one
  transaction, with the batch's app transaction), one Tantivy commit that deletes every
  document first, and in Redis the deletion of every key whose stored position is at or below
  the truncate's (idempotent: a replay deletes nothing newer, and the positions stay as
  tombstones so no older write comes back).
- **Delta SCD2**: history is kept. The source drops only the truncate records (mode
  ``drop``); the sink closes every version open at the truncate (``valid_to`` = the
  truncate's commit time), those of the table and those the batch opened before it, and the
  changes after it open new versions.
- **Delta append**: an append target is a log of changes, and a truncate is one of them: the
  record passes through the transform like any other (mode ``keep``; its ``_type`` is
  ``truncate``, its columns null), and nothing appended before is deleted.
- **Folds**: the source replaces each truncate record with one record of type ``truncate``
  per key the fold holds state for (mode ``fanout``; the keys come from ``FoldKeys``, which
  the sink keeps up to date), in the truncate's place among the stream's records. A key that
  the batch itself gives state before the truncate is not known yet: the stream's records
  before a truncate carry its position (``_truncated_at``), and the fold adds the truncate
  for their key. A fold over one source drops the state (the key is deleted from the view);
  a fold over several sources calls its ``on("truncate")`` handler, which clears that
  source's part of the state (only the handler knows which part that is, so such a fold must
  register one).

"The rows that came from that stream" is exact only when a transform reads the changelog
alone: a transform over several sources (one a changelog) writing a keyed target is refused
at registration (``check_truncatable``); use a fold, or one projection per source. An append
target may read several sources (nothing is deleted there).

Exactly once: the source's choices depend only on the store (records below the head are final),
so a replayed batch reads the same records; each target's replace is part of the batch's
idempotent commit (Delta app transaction, Tantivy checkpoint), or idempotent by position
(Redis).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from lakefold.core.dsn import mask_dsn
from lakefold.projections._model import ChangelogSource, DeltaTableTarget
from lakefold.projections.exceptions import CatalogUnavailableError, ProjectionDefinitionError

if TYPE_CHECKING:
    from lakefold.projections._api import Projection

TRUNCATE = "truncate"
#: How a source hands truncate records to a projection (see the module docstring).
Mode = Literal["keep", "drop", "cut", "fanout"]
#: Column of a fold's changelog frames: the key of a fanned-out truncate record.
FAN_KEY_COLUMN = "_fan_key"
#: Column of a fold's changelog frames: the position of the next truncate of the stream in the
#: same batch (null when none follows the record).
TRUNCATED_AT_COLUMN = "_truncated_at"
#: Column of a fold's output (not written to the target): the key the row belongs to.
FOLD_KEY_COLUMN = "_fold_key"


@dataclass(frozen=True)
class Truncate:
    """A truncate record of a changelog stream: its position and commit time."""

    position: int
    at: dt.datetime


def reads_changelog(projection: Projection) -> bool:
    """True when a source of ``projection`` is a changelog (only those have truncates)."""
    return any(isinstance(s, ChangelogSource) for s in projection.sources)


def source_mode(projection: Projection) -> Mode:
    """How ``projection``'s changelog sources deliver truncate records."""
    if projection.fold is not None:
        return "fanout"
    target = projection.target
    if isinstance(target, DeltaTableTarget) and target.mode == "append":
        return "keep"
    if isinstance(target, DeltaTableTarget) and target.mode == "scd2":
        return "drop"
    return "cut"


def check_truncatable(projection: Projection) -> None:
    """Refuse a definition whose view cannot apply a truncate exactly (see the module
    docstring): a transform over several sources, one a changelog, into a keyed target. Folds
    are checked by ``check_fold_truncates`` once their handlers are known."""
    if projection.fold is not None or len(projection.sources) < 2:
        return
    if source_mode(projection) == "keep" or not reads_changelog(projection):
        return
    tables = " or ".join(s.table for s in projection.sources if isinstance(s, ChangelogSource))
    raise ProjectionDefinitionError(
        f"projection {projection.name}: it reads several sources "
        f"({'; '.join(s.label for s in projection.sources)}) into a {projection.target.kind} "
        f"target. A TRUNCATE of {tables} (also written by `lakefold capture recover`) must "
        "remove exactly the rows that came from that table, and a transform's output does "
        "not say which source a row came from. Define one projection per source, or a Fold "
        "(whose on('truncate') handler clears the table's part of each key), or write to "
        "delta_table('append')"
    )


def check_fold_truncates(projection: Projection) -> None:
    """Refuse a fold over several sources, one a changelog, without an ``on("truncate")``
    handler: only the handler knows which part of a key's state came from the table."""
    fold = projection.fold
    if fold is None or len(projection.sources) < 2 or not reads_changelog(projection):
        return
    if TRUNCATE in fold.handlers:
        return
    tables = " or ".join(s.table for s in projection.sources if isinstance(s, ChangelogSource))
    raise ProjectionDefinitionError(
        f"fold {projection.name} reads several sources "
        f"({'; '.join(s.label for s in projection.sources)}) but has no handler for "
        f"truncates. A TRUNCATE of {tables} (also written by `lakefold capture recover`) "
        "must clear that table's part of every key's state, which only your code knows: add "
        f"'truncate' to a handler (@{projection.name}.on(..., 'truncate')); it is called once "
        "per key with state, with a record of type 'truncate' whose source is the truncated "
        "table's alias (return None to delete the key)"
    )


# --------------------------------------------------------------------------- source side


def next_truncate(positions: pa.Array, truncates: Sequence[int]) -> pa.Array:
    """Per position, the first of the (sorted) ``truncates`` above it, or null."""
    import numpy as np

    marks = np.asarray(sorted(truncates), dtype=np.int64)
    values = positions.to_numpy(zero_copy_only=False).astype(np.int64)
    index = np.searchsorted(marks, values, side="right")
    beyond = index >= len(marks)
    found = marks[np.minimum(index, max(len(marks) - 1, 0))] if len(marks) else values
    return pa.array(found, pa.int64(), mask=beyond)


def cut_records(batch: pa.RecordBatch, cut: int) -> pa.RecordBatch:
    """Mode ``cut``: the records after position ``cut`` (the batch's last truncate; 0 for
    none), truncate records dropped."""
    keep = pc.not_equal(batch.column("_type"), TRUNCATE)
    if cut > 0:
        keep = pc.and_(keep, pc.greater(batch.column("_position"), cut))
    return batch.filter(pc.fill_null(keep, True))


def fan_out(batch: pa.RecordBatch, keys: Sequence[str],
            truncates: Sequence[int]) -> pa.RecordBatch:
    """Mode ``fanout``: each truncate record becomes one record per key in ``keys``, with the
    key in ``FAN_KEY_COLUMN`` (null on every other record); every other record gets the
    position of the next of the micro-batch's ``truncates`` in ``TRUNCATED_AT_COLUMN``."""
    is_truncate = pc.fill_null(pc.equal(batch.column("_type"), TRUNCATE), False)
    others = batch.filter(pc.invert(is_truncate))
    others = others.append_column(FAN_KEY_COLUMN, pa.nulls(others.num_rows, pa.string()))
    others = others.append_column(TRUNCATED_AT_COLUMN, next_truncate(
        others.column("_position"), truncates) if truncates else pa.nulls(
        others.num_rows, pa.int64()))
    found = batch.filter(is_truncate)
    if not found.num_rows or not keys:
        return others
    rows = pa.array([i for i in range(found.num_rows) for _ in keys], pa.int64())
    fanned = found.take(rows)
    fanned = fanned.append_column(
        FAN_KEY_COLUMN, pa.array(list(keys) * found.num_rows, pa.string()))
    fanned = fanned.append_column(TRUNCATED_AT_COLUMN, pa.nulls(fanned.num_rows, pa.int64()))
    return pa.concat_batches([others, fanned])


def apply_mode(batch: pa.RecordBatch, mode: Mode, *, truncates: Sequence[int] = (),
               keys: Sequence[str] | None = None) -> pa.RecordBatch:
    """A changelog batch as a projection in ``mode`` reads it (see the module docstring);
    ``truncates``: the positions of the micro-batch's truncates (all of its partitions)."""
    if mode == "keep":
        return batch
    if mode == "fanout":
        return fan_out(batch, keys or (), truncates)
    return cut_records(batch, max(truncates, default=0) if mode == "cut" else 0)


# --------------------------------------------------------------------------- fold keys

_KEYS_DDL = """
CREATE TABLE IF NOT EXISTS lakefold.projection_fold_keys (
    name text NOT NULL,
    generation integer NOT NULL,
    key text NOT NULL,
    PRIMARY KEY (name, generation, key)
)
"""


class FoldKeys:
    """The keys a fold generation has emitted (a superset of the keys it holds state for),
    kept by the sink after each batch and read by the source to fan truncates out. Only ever
    grows while the generation lives: a key that lost its state gets a truncate record that
    changes nothing."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: psycopg.Connection[Any] | None = None  # kept by ``add`` (every batch)

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
        except psycopg.OperationalError as e:
            raise CatalogUnavailableError(
                f"the store at {mask_dsn(self.dsn)} is unreachable ({e}); retrying") from e

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def install(self) -> None:
        """Create the keys table if missing (idempotent, also when run concurrently)."""
        with self._connect() as conn:
            try:
                conn.execute(_KEYS_DDL)
            except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
                pass  # created by another runner at the same moment: that is fine

    def add(self, name: str, generation: int, keys: Iterable[str]) -> None:
        """Record ``keys`` (idempotent)."""
        unique = sorted(set(keys))
        if not unique:
            return
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        try:
            self._conn.execute(
                "INSERT INTO lakefold.projection_fold_keys (name, generation, key) "
                "SELECT %s, %s, k FROM unnest(%s::text[]) AS k ON CONFLICT DO NOTHING",
                (name, generation, unique))
        except psycopg.OperationalError as e:
            self.close()
            raise CatalogUnavailableError(
                f"recording the keys of {name} generation {generation} failed ({e}); "
                "retrying the batch") from e

    def keys(self, name: str, generation: int) -> list[str]:
        """Every key recorded for the generation (none when nothing was recorded yet)."""
        with self._connect() as conn:
            row = conn.execute(
                "SELECT to_regclass('lakefold.projection_fold_keys') IS NOT NULL").fetchone()
            if not (row and row[0]):
                return []
            return [r[0] for r in conn.execute(
                "SELECT key FROM lakefold.projection_fold_keys WHERE name = %s "
                "AND generation = %s ORDER BY key", (name, generation))]

    def drop(self, name: str, generation: int) -> None:
        """Forget a dropped generation's keys."""
        with self._connect() as conn:
            row = conn.execute(
                "SELECT to_regclass('lakefold.projection_fold_keys') IS NOT NULL").fetchone()
            if row and row[0]:
                conn.execute("DELETE FROM lakefold.projection_fold_keys WHERE name = %s "
                             "AND generation = %s", (name, generation))
