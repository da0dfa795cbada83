"""One generation's ``foreachBatch`` function: write each micro-batch to the generation's
target exactly once, dead-letter what the target refuses, and note the progress.

Order of one batch (Spark calls it with the batch's DataFrame and id; a batch interrupted by a
crash is called again with the same id and the same records):

1. Read the batch's end offsets from Spark's offset log (written before the batch ran), and
   move the generation's changelog positions to the batch's start: the previous batch is
   committed in the target and in Spark's checkpoint, so compaction may pass it (``_readers``).
2. Split off dead letters emitted by fold handlers.
3. Write the rows to the target as batch ``batch_id``: Delta commits with the app transaction
   (projection@generation, batch id), Redis applies Lua chunks guarded by its checkpoint and
   per-key positions, Tantivy commits once with the batch id. Each skips what it already has.
   When the batch holds a truncate of a changelog source (asked of the store for the batch's
   range), the write applies it too (see ``_truncate``: the view's rows of the stream go, or
   SCD2 closes its open versions). A fold's keys are recorded for later truncates.
4. Record dead letters (idempotent by reference) and resolve retried ones.
5. Record the batch in the catalog (informational: status, lag, the rebuild's catch-up test).

Spark commits its offsets only after this function returns, so a crash anywhere here replays
the batch, and step 3 makes the replay a no-op.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from lakefold.core.exceptions import LakefoldError
from lakefold.projections.definitions import _codec
from lakefold.projections.definitions._api import Projection
from lakefold.projections.definitions._codec import key_text
from lakefold.projections.definitions._model import POSITION_COLUMN
from lakefold.projections.definitions._targets import TargetBatch, TargetContext
from lakefold.projections.definitions._truncate import FOLD_KEY_COLUMN, reads_changelog, source_mode
from lakefold.projections.operators._fold import DEAD_LETTER_COLUMN
from lakefold.projections.state._catalog import Catalog, Generation
from lakefold.projections.state._deadletters import DeadLetter, DeadLetters, NewDeadLetter
from lakefold.projections.state._readers import GenerationReads, read_offsets
from lakefold.spark.internals import (
    ChangelogSource,
    DeltaSource,
    FoldKeys,
    Truncate,
    source_reads,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

RETRY_SOURCE = "_retry"


@dataclass
class Progress:
    """What the runner reads about a running generation (updated after every batch)."""

    batch_id: int | None = None
    end: dict[str, int] = field(default_factory=dict)
    #: The end of the batch being written (its effect may be visible before ``end`` moves).
    pending: dict[str, int] = field(default_factory=dict)
    records: int = 0
    batches: int = 0  # committed by this sink (Spark's batch ids go on across runs)
    last_batch_at: float | None = None
    error: BaseException | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class GenerationSink:
    """The ``foreachBatch`` function of one generation (see the module docstring)."""

    def __init__(self, projection: Projection, generation: Generation, *, catalog: Catalog,
                 dead_letters: DeadLetters, redis_url: str | None, namespace: str,
                 output_schema: pa.Schema | None = None) -> None:
        self.projection = projection
        self.generation = generation
        self.catalog = catalog
        self.dead_letters = dead_letters
        self.redis_url = redis_url
        self.namespace = namespace
        self.progress = Progress()
        self._fold_keys: FoldKeys | None = None
        if projection.fold is not None and reads_changelog(projection):
            self._fold_keys = FoldKeys(catalog.dsn)
            self._fold_keys.install()
        #: The generation's positions in the changelog streams it reads (hold compaction).
        self.reads = GenerationReads(catalog.dsn, projection, generation.generation)
        if output_schema is not None and FOLD_KEY_COLUMN in output_schema.names:
            output_schema = output_schema.remove(output_schema.get_field_index(FOLD_KEY_COLUMN))
        target = projection.target
        self.target = target.open(
            generation.location(target.kind),
            TargetContext(projection.name, generation.generation, redis_url=redis_url,
                          redis_namespace=namespace, schema=output_schema))

    def close(self) -> None:
        self.reads.close()
        self.target.close()
        if self._fold_keys is not None:
            self._fold_keys.close()

    def publish(self) -> None:
        """Point the target's readers at this generation (call after the catalog switch;
        Redis readers follow a pointer)."""
        self.target.publish()

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        try:
            self.handle(df, batch_id)
        except BaseException as e:
            with self.progress.lock:
                self.progress.error = e
            raise

    # ------------------------------------------------------------------ one batch

    def handle(self, df: DataFrame, batch_id: int) -> None:
        checkpoint = self.generation.checkpoint_dir
        end = read_offsets(checkpoint, batch_id) or {}
        start = read_offsets(checkpoint, batch_id - 1) if batch_id > 0 else {}
        start = start or {}
        # What came before this batch is in the target and in Spark's checkpoint: compaction
        # may pass it now (and a generation that compaction passed anyway stops here).
        self.reads.advance({a: p for a, p in start.items() if a != RETRY_SOURCE})
        # A new generation's first batch starts at offset 0, but positions start at 1; a
        # Delta input's positions number table versions (``records_between``).
        records = sum(self._records(a, start.get(a, 0), p) for a, p in end.items()
                      if a != RETRY_SOURCE)
        batch_position = sum(p for a, p in end.items() if a != RETRY_SOURCE)
        with self.progress.lock:
            self.progress.pending = {a: p for a, p in end.items() if a != RETRY_SOURCE}
        letters: list[NewDeadLetter] = []
        retried = self._pending_target_retries()
        truncates = self._truncates(start, end)
        letters += self._write(df, TargetBatch(batch_id, batch_position, tuple(truncates)),
                               retried, records)
        if letters:
            self.dead_letters.add(self.projection.name, self.generation.generation, letters)
        self._resolve_retries(start, end, retried)
        source_end = {a: p for a, p in end.items() if a != RETRY_SOURCE}
        self.catalog.record_batch(self.projection.name, self.generation.generation, batch_id,
                                  source_end, records)
        with self.progress.lock:
            self.progress.batch_id = batch_id
            self.progress.end = source_end
            self.progress.records += records
            self.progress.batches += 1
            self.progress.last_batch_at = time.time()
            self.progress.error = None

    def _records(self, alias: str, start: int, end: int) -> int:
        """About how many input records ``[start, end)`` of a source holds."""
        try:
            source = self.projection.source(alias)
        except LakefoldError:  # not a source of the definition: counted by positions
            return max(0, end - max(start, 1))
        if not isinstance(source, DeltaSource):
            return max(0, end - max(start, 1))
        return source_reads.records_between(source, start, end)

    def _truncates(self, start: Mapping[str, int], end: Mapping[str, int]) -> list[Truncate]:
        """The truncates of the batch's changelog ranges that the target must apply itself
        (a transform's, unless it appends: see ``_truncate``), in position order."""
        if self.projection.fold is not None or source_mode(self.projection) == "keep":
            return []
        found: list[Truncate] = []
        for source in self.projection.sources:
            if isinstance(source, ChangelogSource) and source.alias in end:
                found += source_reads.changelog_truncates(
                    self.catalog.dsn, source.table, start.get(source.alias, 0),
                    end[source.alias])
        return sorted(found, key=lambda t: t.position)

    def _record_fold_keys(self, keys: list[Any]) -> None:
        if self._fold_keys is not None:
            self._fold_keys.add(self.projection.name, self.generation.generation,
                                (str(k) for k in keys if k is not None))

    def _pending_target_retries(self) -> list[DeadLetter]:
        return [d for d in self.dead_letters.pending_retries(
            self.projection.name, self.generation.generation) if d.stage == "target"]

    def _resolve_retries(self, start: Mapping[str, int], end: Mapping[str, int],
                         retried: list[DeadLetter]) -> None:
        ids = [d.id for d in retried]
        if RETRY_SOURCE in end:
            low, high = start.get(RETRY_SOURCE, 0), end[RETRY_SOURCE]
            ids += [d.id for d in self.dead_letters.pending_retries(
                self.projection.name, self.generation.generation, after_seq=low - 1,
                up_to_seq=high - 1) if d.stage == "fold"]
        self.dead_letters.resolve(ids)

    def _fold_letters(self, rows: list[str]) -> list[NewDeadLetter]:
        letters = []
        for text in rows:
            data = _codec.loads(text)
            letters.append(NewDeadLetter(
                ref=data["ref"], stage=data["stage"], source=data["source"],
                position=int(data["position"]), record=_codec.plain(data["record"]),
                error=data["error"], attempts=int(data["attempts"])))
        return letters

    def _write(self, df: DataFrame, batch: TargetBatch, retried: list[DeadLetter],
               records: int) -> list[NewDeadLetter]:
        """Write the batch on the driver or through Spark's tasks, as the target prefers
        (``max_driver_rows``), and return the dead letters."""
        limit = self.target.max_driver_rows
        if limit is None or (limit > 0 and records <= limit):
            return self._write_from_driver(df, batch, retried)
        if limit == 0:
            return self._write_distributed(df, batch, retried)
        # A large input batch (a rebuild's) often folds into few output rows (an aggregate
        # over few keys): compute it once, and write it from the driver when it is small,
        # which spares the sink's distributed staging round trip.
        df = df.persist()
        try:
            if df.count() <= limit:
                return self._write_from_driver(df, batch, retried)
            return self._write_distributed(df, batch, retried)
        finally:
            df.unpersist()

    def _write_distributed(self, df: DataFrame, batch: TargetBatch,
                           retried: list[DeadLetter]) -> list[NewDeadLetter]:
        """Through Spark's tasks (the Delta sink: tasks write the files, the driver commits
        them)."""
        from pyspark.sql import functions as F

        letters: list[NewDeadLetter] = []
        internal = [c for c in (DEAD_LETTER_COLUMN, FOLD_KEY_COLUMN) if c in df.columns]
        if internal:
            df = df.persist()
            try:
                data = df
                if DEAD_LETTER_COLUMN in df.columns:
                    dead = [r[0] for r in df.filter(F.col(DEAD_LETTER_COLUMN).isNotNull())
                            .select(DEAD_LETTER_COLUMN).collect()]
                    letters += self._fold_letters(dead)
                    data = df.filter(F.col(DEAD_LETTER_COLUMN).isNull())
                if FOLD_KEY_COLUMN in df.columns:
                    self._record_fold_keys([r[0] for r in data.select(FOLD_KEY_COLUMN)
                                            .distinct().collect()])
                data = self._with_retried_rows(data.drop(*internal), retried)
                self.target.write_frame(data, batch)
            finally:
                df.unpersist()
        else:
            self.target.write_frame(self._with_retried_rows(df, retried), batch)
        return letters

    def _collect(self, df: DataFrame, retried: list[DeadLetter]
                 ) -> tuple[pa.Table, list[NewDeadLetter]]:
        """One Spark job: the micro-batch on the driver as Arrow, without the rows that failed
        (returned as dead letters) and with the rows of retried dead letters added."""
        table = df.toArrow()
        letters: list[NewDeadLetter] = []
        if DEAD_LETTER_COLUMN in table.column_names:
            dead_mask = pc.is_valid(table.column(DEAD_LETTER_COLUMN))
            letters += self._fold_letters(table.filter(dead_mask).column(
                DEAD_LETTER_COLUMN).to_pylist())
            table = table.filter(pc.invert(dead_mask)).drop_columns([DEAD_LETTER_COLUMN])
        if FOLD_KEY_COLUMN in table.column_names:
            self._record_fold_keys(pc.unique(table.column(FOLD_KEY_COLUMN)).to_pylist())
            table = table.drop_columns([FOLD_KEY_COLUMN])
        if retried:
            rows = [_codec.loads(_codec.dumps(d.record["row"])) for d in retried]
            table = pa.concat_tables([table, pa.Table.from_pylist(rows, schema=table.schema)])
        return table, letters

    def _with_retried_rows(self, df: DataFrame, retried: list[DeadLetter]) -> DataFrame:
        if not retried:
            return df
        rows = [_codec.loads(_codec.dumps(d.record["row"])) for d in retried]
        extra = df.sparkSession.createDataFrame(
            [tuple(r.get(c) for c in df.columns) for r in rows], df.schema)
        return df.unionByName(extra)

    def _write_from_driver(self, df: DataFrame, batch: TargetBatch,
                           retried: list[DeadLetter]) -> list[NewDeadLetter]:
        """One Spark job: collect, split off dead letters, write from the driver; the rows
        the target refuses become dead letters."""
        table, letters = self._collect(df, retried)
        rejected: list[tuple[dict[str, Any], str]] = []
        self.target.write(table, batch, rejected=rejected)
        key_column = self.target.keys[0] if self.target.keys else ""
        for row, error in rejected:
            key = row.get(key_column)
            position = row.get(POSITION_COLUMN)
            reference = key_text(key) if key is not None else _codec.dumps(row)
            letters.append(NewDeadLetter(
                ref=f"target:{reference}:{position if position is not None else batch.position}",
                stage="target", source=self.target.kind,
                position=int(position) if position is not None else batch.position,
                record={"row": _codec.plain(row)}, error=error, attempts=1))
        return letters
