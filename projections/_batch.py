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

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from lakefold.projections import _codec, _stores
from lakefold.projections._api import Projection
from lakefold.projections._catalog import Catalog, Generation
from lakefold.projections._deadletters import DeadLetter, DeadLetters, NewDeadLetter
from lakefold.projections._delta import DRIVER_MERGE_ROWS, DeltaViewWriter
from lakefold.projections._fold import DEAD_LETTER_COLUMN
from lakefold.projections._model import (
    POSITION_COLUMN,
    ChangelogSource,
    DeltaTableTarget,
    RedisCacheTarget,
    SearchIndexTarget,
)
from lakefold.projections._readers import GenerationReads
from lakefold.projections._redis import RedisCacheWriter, key_text
from lakefold.projections._search import IndexLayout, SearchIndexWriter
from lakefold.projections._truncate import (
    FOLD_KEY_COLUMN,
    FoldKeys,
    Truncate,
    reads_changelog,
    source_mode,
)
from lakefold.projections.exceptions import ProjectionTerminalError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

RETRY_SOURCE = "_retry"


def read_offsets(checkpoint_dir: str, batch_id: int) -> dict[str, int] | None:
    """Source alias → end position of ``batch_id``, from Spark's offset log."""
    path = Path(checkpoint_dir) / "offsets" / str(batch_id)
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None
    positions: dict[str, int] = {}
    for line in lines[2:]:
        line = line.strip()
        if not line or line == "-":
            continue
        offset = json.loads(line)
        if isinstance(offset, dict) and "source" in offset and "position" in offset:
            positions[str(offset["source"])] = int(offset["position"])
    return positions


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
        self._output_schema = output_schema
        self._redis: RedisCacheWriter | None = None
        self._search: SearchIndexWriter | None = None
        self._delta: DeltaViewWriter | None = None
        self._fold_keys: FoldKeys | None = None
        if projection.fold is not None and reads_changelog(projection):
            self._fold_keys = FoldKeys(catalog.dsn)
            self._fold_keys.install()
        #: The generation's positions in the changelog streams it reads (hold compaction).
        self.reads = GenerationReads(catalog.dsn, projection, generation.generation)
        target = projection.target
        if isinstance(target, DeltaTableTarget):
            self._delta = DeltaViewWriter(target, generation.delta_path,
                                          app_id=f"{projection.name}@{generation.generation}",
                                          name=projection.name)
        elif isinstance(target, RedisCacheTarget):
            if redis_url is None:
                raise ProjectionTerminalError(
                    f"projection {projection.name} writes to Redis, but no Redis URL is "
                    "configured; set LAKEFOLD_REDIS_URL"
                )
            self._redis = RedisCacheWriter(redis_url, generation.redis_prefix, key=target.key,
                                           format=target.format)

    def close(self) -> None:
        self.reads.close()
        if self._redis is not None:
            self._redis.close()
        if self._search is not None:
            self._search.close()
        if self._fold_keys is not None:
            self._fold_keys.close()

    def publish(self) -> None:
        """Point Redis readers at this generation (call after the catalog switch)."""
        if self._redis is not None:
            self._redis.publish(self.projection.name, self.namespace, self.generation.generation)

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
        # A new generation's first batch starts at offset 0, but positions start at 1.
        records = sum(max(0, p - max(start.get(a, 0), 1)) for a, p in end.items()
                      if a != RETRY_SOURCE)
        batch_position = sum(p for a, p in end.items() if a != RETRY_SOURCE)
        with self.progress.lock:
            self.progress.pending = {a: p for a, p in end.items() if a != RETRY_SOURCE}
        letters: list[NewDeadLetter] = []
        retried = self._pending_target_retries()
        truncates = self._truncates(start, end)
        if self._delta is not None:
            letters += self._write_delta(df, batch_id, retried, records, truncates)
        else:
            letters += self._write_rows(df, batch_id, batch_position, retried, truncates)
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

    def _truncates(self, start: Mapping[str, int], end: Mapping[str, int]) -> list[Truncate]:
        """The truncates of the batch's changelog ranges that the target must apply itself
        (a transform's, unless it appends: see ``_truncate``), in position order."""
        if self.projection.fold is not None or source_mode(self.projection) == "keep":
            return []
        found: list[Truncate] = []
        for source in self.projection.sources:
            if isinstance(source, ChangelogSource) and source.alias in end:
                found += _stores.changelog_truncates(
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

    def _write_delta(self, df: DataFrame, batch_id: int, retried: list[DeadLetter],
                     records: int, truncates: list[Truncate]) -> list[NewDeadLetter]:
        assert self._delta is not None  # noqa: S101
        if self._delta.spec.mode == "append":
            return self._write_delta_distributed(df, batch_id, retried, truncates)
        if records <= DRIVER_MERGE_ROWS:
            return self._write_delta_from_driver(df, batch_id, retried, truncates)
        # A large input batch (a rebuild's) often folds into few output rows (an aggregate
        # over few keys): compute it once, and merge it from the driver when it is small, which
        # spares the sink's distributed staging round trip.
        df = df.persist()
        try:
            if df.count() <= DRIVER_MERGE_ROWS:
                return self._write_delta_from_driver(df, batch_id, retried, truncates)
            return self._write_delta_distributed(df, batch_id, retried, truncates)
        finally:
            df.unpersist()

    def _write_delta_from_driver(self, df: DataFrame, batch_id: int,
                                 retried: list[DeadLetter], truncates: list[Truncate]
                                 ) -> list[NewDeadLetter]:
        """One Spark job: collect, split off dead letters, merge from the driver."""
        assert self._delta is not None  # noqa: S101
        table, letters = self._collect(df, retried)
        if self._delta.spec.mode == "scd2":
            self._delta.write_scd2(table, batch_id, truncates=truncates)
        else:
            self._delta.write_arrow(table, batch_id, replace=bool(truncates))
        return letters

    def _write_delta_distributed(self, df: DataFrame, batch_id: int,
                                 retried: list[DeadLetter], truncates: list[Truncate]
                                 ) -> list[NewDeadLetter]:
        """Through the Spark sink: tasks write the files, the driver commits them."""
        from pyspark.sql import functions as F

        assert self._delta is not None  # noqa: S101
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
                self._delta.write(data, batch_id, truncates=truncates)
            finally:
                df.unpersist()
        else:
            self._delta.write(self._with_retried_rows(df, retried), batch_id,
                              truncates=truncates)
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

    def _write_rows(self, df: DataFrame, batch_id: int, batch_position: int,
                    retried: list[DeadLetter], truncates: list[Truncate]
                    ) -> list[NewDeadLetter]:
        table, letters = self._collect(df, retried)
        rejected: list[tuple[dict[str, Any], str]] = []
        target = self.projection.target
        if isinstance(target, RedisCacheTarget):
            assert self._redis is not None  # noqa: S101
            self._redis.write(table, batch_id=batch_id, position=batch_position,
                              rejected=rejected,
                              truncated_at=truncates[-1].position if truncates else None)
        elif isinstance(target, SearchIndexTarget):
            if self._search is None:
                schema = self._output_schema or table.schema
                if FOLD_KEY_COLUMN in schema.names:
                    schema = schema.remove(schema.get_field_index(FOLD_KEY_COLUMN))
                layout = IndexLayout.from_arrow(schema, key=target.key, text=target.text)
                self._search = SearchIndexWriter(self.generation.index_dir, layout)
            self._search.write(table, batch_id=batch_id, rejected=rejected,
                               replace=bool(truncates))
        key_column = target.key if isinstance(target, RedisCacheTarget | SearchIndexTarget) \
            else ""
        for row, error in rejected:
            key = row.get(key_column)
            position = row.get(POSITION_COLUMN)
            reference = key_text(key) if key is not None else _codec.dumps(row)
            letters.append(NewDeadLetter(
                ref=f"target:{reference}:{position if position is not None else batch_position}",
                stage="target", source=target.kind,
                position=int(position) if position is not None else batch_position,
                record={"row": _codec.plain(row)}, error=error, attempts=1))
        return letters
