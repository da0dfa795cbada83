"""How a changelog source hands its truncate records to a reader: the truncate modes.

A truncate record (``_type`` ``truncate``, every column null) means "every row of the table so
far is gone". What a view does about it is the reader's policy (``lakefold.projections``'
``_truncate`` module picks the mode per target); the source applies the mode to each range it
reads:

- ``keep``: truncate records pass like any other record;
- ``drop``: truncate records are dropped;
- ``cut``: the records up to the micro-batch's last truncate are dropped (the batch's truncate
  positions, asked from the store once per batch, travel with every partition);
- ``fanout``: each truncate record becomes one record per key in ``FoldKeys`` for the reader
  (column ``_fan_key``), and every other record carries the position of the next truncate of
  the micro-batch (column ``_truncated_at``).

``FoldKeys`` is where a fold generation's keys are kept: its sink adds the keys it emits after
each batch, the source reads them to fan truncates out.

The choices depend only on the store (records below the head are final), so a replayed batch
reads the same records.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from lakefold.core import migrations
from lakefold.core.dsn import mask_dsn
from lakefold.core.migrations import Migration
from lakefold.spark.exceptions import SourceUnavailableError

TRUNCATE = "truncate"
#: How a source hands truncate records to a reader (see the module docstring).
Mode = Literal["keep", "drop", "cut", "fanout"]
#: Column of a fold's changelog frames: the key of a fanned-out truncate record.
FAN_KEY_COLUMN = "_fan_key"
#: Column of a fold's changelog frames: the position of the next truncate of the stream in the
#: same batch (null when none follows the record).
TRUNCATED_AT_COLUMN = "_truncated_at"


@dataclass(frozen=True)
class Truncate:
    """A truncate record of a changelog stream: its position and commit time."""

    position: int
    at: dt.datetime


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
_KEYS = migrations.register("fold_keys", Migration(1, "keys a fold generation emitted",
                                                   _KEYS_DDL))


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
            raise SourceUnavailableError(
                f"the store at {mask_dsn(self.dsn)} is unreachable ({e}); retrying") from e

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def install(self) -> None:
        """Create the keys table if missing (idempotent, also when run concurrently)."""
        with self._connect() as conn:
            migrations.migrate(conn, _KEYS)

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
            raise SourceUnavailableError(
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
