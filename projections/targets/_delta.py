"""The Delta target: append and upsert through the Spark layer's exactly-once sink, and SCD
type 2 history written here with the same app-transaction rule.

SCD2 table layout: the output's columns (keys, attributes, ``_position``), plus
``valid_from`` (the change's time, from the ``valid_from`` column of the output, ``_ts`` by
default), ``valid_to`` (null while the version is current) and ``current``.

One SCD2 batch is one Delta transaction (a delta-rs merge) carrying
``Transaction(app_id, batch_id)``; a batch whose id the table already records for ``app_id`` is
skipped, so a replay after a crash is a no-op. Per key the batch's changes are applied in
``_position`` order: each change that alters the attributes closes the current version
(``valid_to`` = the change's time, ``current`` = false) and opens a new one; a change that
alters nothing is ignored; a ``_deleted`` row closes the current version without opening one.
A truncate of the source in the batch (``truncates``) closes, at its commit time, every
version open at its position: the table's current ones and those the batch opened before it.

An upsert batch that holds a truncate (``replace``) replaces the table's content: the rows
the batch does not name are deleted in the batch's transaction (the source handed over only
the records after the truncate; see ``_truncate``).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from lakefold.core.arrow_tables import latest_per_key
from lakefold.core.object_store import filesystem_for, storage_options_for
from lakefold.projections.definitions._model import (
    DELETED_COLUMN,
    POSITION_COLUMN,
)
from lakefold.projections.definitions._target_specs import CURRENT, VALID_FROM, VALID_TO
from lakefold.projections.definitions._targets import (
    GenerationTarget,
    Rejected,
    TargetBatch,
    TargetContext,
)
from lakefold.projections.exceptions import (
    IncompatibleTargetError,
    TargetError,
    TargetUnavailableError,
)
from lakefold.spark import DeltaTarget, WriteMode, write_batch
from lakefold.spark.internals import (
    Truncate,
    batch_properties,
    is_committed,
    keys_match,
    quote_identifier,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lakefold.projections.definitions._target_specs import DeltaTableTarget



@dataclass(frozen=True)
class DeltaWriteResult:
    skipped: bool
    rows: int
    version: int


#: Upsert batches up to this many rows are merged from the driver (one Spark job to collect
#: them, one delta-rs merge); bigger ones go through the Spark sink's distributed write.
DRIVER_MERGE_ROWS = 200_000


class DeltaViewWriter:
    """Writes batches of one generation's Delta table, exactly once per batch id.

    ``append`` goes through the Spark layer's sink (tasks write Parquet, the driver commits).
    ``upsert`` batches are small in live operation (a fold or an aggregation emits one row per
    changed key), so they are collected and merged by delta-rs on the driver, which saves the
    sink's distributed staging round trip; large ones (a rebuild) use the Spark sink too. Both
    paths use the same app transaction (projection@generation, batch id).
    """

    def __init__(self, spec: DeltaTableTarget, path: str, *, app_id: str, name: str) -> None:
        self.spec = spec
        self.path = path
        self.app_id = app_id
        self.name = name
        self.storage_options = storage_options_for(path)
        #: The table as last read, brought up to date by each ``_open`` (opening a table
        #: reads its whole log; an update reads only the commits since).
        self._table: DeltaTable | None = None

    def write(self, df: DataFrame, batch_id: int, *, rows_hint: int | None = None,
              truncates: Sequence[Truncate] = ()) -> DeltaWriteResult:
        """Write one batch. ``rows_hint`` (the batch's input records, when known) picks the
        driver merge for small upserts. ``truncates``: the source's truncates in the batch
        (see the module docstring; an append target keeps its rows)."""
        columns = df.columns
        if self.spec.mode == "scd2":
            return self.write_scd2(df.toArrow(), batch_id, truncates=truncates)
        replace = bool(truncates) and self.spec.mode == "upsert"
        if self.spec.mode == "upsert" and rows_hint is not None \
                and rows_hint <= DRIVER_MERGE_ROWS:
            return self.write_arrow(df.toArrow(), batch_id, replace=replace)
        mode = WriteMode.APPEND if self.spec.mode == "append" else WriteMode.UPSERT
        keyed = mode is WriteMode.UPSERT
        target = DeltaTarget(
            path=self.path, mode=mode, app_id=self.app_id,
            keys=self.spec.keys if keyed else (),
            partition_by=self.spec.partition_by,
            order_by=POSITION_COLUMN if keyed and POSITION_COLUMN in columns else None,
            deleted_column=DELETED_COLUMN if keyed and DELETED_COLUMN in columns else None,
            delete_unmatched=replace,
            name=self.name,
        )
        result = write_batch(df, target, batch_id)
        return DeltaWriteResult(result.skipped, result.rows_written, result.table_version)

    def _committed(self, table: DeltaTable | None, batch_id: int) -> bool:
        return table is not None and is_committed(table, self.app_id, batch_id)

    def write_arrow(self, rows: pa.Table, batch_id: int, *, replace: bool = False
                    ) -> DeltaWriteResult:
        """Upsert ``rows`` by key from the driver, exactly once per batch id: per key the row
        with the highest ``_position`` wins; rows with ``_deleted`` true delete the key. With
        ``replace`` (a truncate), the table's rows that ``rows`` does not name are deleted in
        the same transaction."""
        table = self._open()
        if self._committed(table, batch_id):
            assert table is not None  # noqa: S101
            return DeltaWriteResult(True, 0, table.version())
        rows = latest_per_key(rows, self.spec.keys, order=POSITION_COLUMN
                              if POSITION_COLUMN in rows.column_names else None)
        properties = batch_properties(self.app_id, batch_id)
        flag = DELETED_COLUMN in rows.column_names
        data_columns = [c for c in rows.column_names if c != DELETED_COLUMN]
        try:
            if table is None:
                keep = rows.filter(pc.invert(pc.fill_null(rows.column(DELETED_COLUMN), False))) \
                    if flag else rows
                keep, file_size = _clustered(keep.select(data_columns), self.spec.keys)
                write_deltalake(self.path, keep, mode="append", name=self.name,
                                partition_by=list(self.spec.partition_by) or None,
                                commit_properties=properties, target_file_size=file_size,
                                configuration={"delta.targetFileSize": str(file_size)},
                                storage_options=self.storage_options)
                return DeltaWriteResult(False, keep.num_rows, 0)
            target_schema = pa.schema(table.schema().to_arrow())
            source = _cast_like(rows, target_schema)
            predicate = keys_match(self.spec.keys)
            if not replace:  # a truncate's merge reads every row anyway
                predicate = " AND ".join(filter(None, (
                    predicate, key_filter(source, self.spec.keys))))
            updates = {quote_identifier(c): f"s.{quote_identifier(c)}" for c in data_columns}
            if replace and source.num_rows == 0:
                table.delete(commit_properties=properties)
                return DeltaWriteResult(False, 0, table.version())
            merger = table.merge(source, predicate, source_alias="s", target_alias="t",
                                 commit_properties=properties)
            if replace:
                merger = merger.when_not_matched_by_source_delete()
            if flag:
                tombstone = f's."{DELETED_COLUMN}" = true'
                live = f'(s."{DELETED_COLUMN}" IS NULL OR s."{DELETED_COLUMN}" = false)'
                merger = (merger.when_matched_delete(predicate=tombstone)
                          .when_matched_update(updates, predicate=live)
                          .when_not_matched_insert(updates, predicate=live))
            else:
                merger = merger.when_matched_update(updates).when_not_matched_insert(updates)
            merger.execute()
            return DeltaWriteResult(False, rows.num_rows, table.version())
        except CommitFailedError as e:
            raise TargetUnavailableError(
                f"commit of batch {batch_id} to {self.path} conflicted with another writer; "
                "retrying the batch"
            ) from e

    def append_arrow(self, rows: pa.Table, batch_id: int) -> DeltaWriteResult:
        """Append ``rows`` from the driver, exactly once per batch id."""
        table = self._open()
        if self._committed(table, batch_id):
            assert table is not None  # noqa: S101
            return DeltaWriteResult(True, 0, table.version())
        properties = batch_properties(self.app_id, batch_id)
        write_deltalake(self.path, rows, mode="append", name=self.name,
                        partition_by=list(self.spec.partition_by) or None,
                        commit_properties=properties, storage_options=self.storage_options)
        version = self._open()
        return DeltaWriteResult(False, rows.num_rows, version.version() if version else 0)

    # ------------------------------------------------------------------ SCD2

    def _open(self) -> DeltaTable | None:
        """The table at its newest version (None: there is none yet)."""
        if self._table is not None:
            try:
                self._table.update_incremental()
                return self._table
            except (DeltaError, OSError):  # dropped or replaced: read it afresh
                self._table = None
        try:
            self._table = DeltaTable(self.path, storage_options=self.storage_options)
        except TableNotFoundError:
            return None
        return self._table

    def write_scd2(self, rows: pa.Table, batch_id: int, *,
                   truncates: Sequence[Truncate] = ()) -> DeltaWriteResult:
        """Apply one batch of changes as SCD2 history (see the module docstring)."""
        table = self._open()
        if table is not None and is_committed(table, self.app_id, batch_id):
            return DeltaWriteResult(True, 0, table.version())
        keys = list(self.spec.keys)
        attributes = [c for c in rows.column_names
                      if c not in keys and c not in (POSITION_COLUMN, DELETED_COLUMN,
                                                     self.spec.valid_from)]
        current = self._current_rows(table, rows, keys, every_key=bool(truncates)) \
            if table is not None else {}
        changes = rows.to_pylist()
        if truncates:
            changes += _truncate_closes(changes, current, keys, self.spec.valid_from,
                                        truncates, rows.schema.field(self.spec.valid_from).type)
        closes, inserts = _versions(changes, keys, attributes, self.spec.valid_from, current)
        properties = batch_properties(self.app_id, batch_id)
        schema = _scd2_schema(rows.schema, self.spec.valid_from)
        new_rows = pa.Table.from_pylist(inserts, schema=schema)
        try:
            if table is None:
                write_deltalake(self.path, new_rows, mode="append", name=self.name,
                                partition_by=list(self.spec.partition_by) or None,
                                commit_properties=properties,
                                storage_options=self.storage_options)
                return DeltaWriteResult(False, len(inserts), 0)
            source = pa.concat_tables([
                _with_action(pa.Table.from_pylist(closes, schema=schema), "close"),
                _with_action(new_rows, "insert"),
            ])
            predicate = " AND ".join(
                [keys_match(keys), f't."{CURRENT}" = true', "s._action = 'close'"])
            (table.merge(source, predicate, source_alias="s", target_alias="t",
                         commit_properties=properties)
             .when_matched_update({VALID_TO: f's."{VALID_TO}"', CURRENT: "false"})
             .when_not_matched_insert({f'"{c}"': f's."{c}"' for c in schema.names},
                                      predicate="s._action = 'insert'")
             .execute())
            return DeltaWriteResult(False, len(inserts) + len(closes), table.version())
        except CommitFailedError as e:
            raise TargetUnavailableError(
                f"SCD2 commit of batch {batch_id} to {self.path} conflicted with another "
                "writer; retrying the batch"
            ) from e
        except (ValueError, pa.ArrowInvalid) as e:
            raise TargetError(f"SCD2 batch {batch_id} cannot be written to {self.path}: {e}") \
                from e

    def _current_rows(self, table: DeltaTable, rows: pa.Table, keys: list[str], *,
                      every_key: bool = False) -> dict[tuple[Any, ...], dict[str, Any]]:
        """The current version of each key of the batch (``every_key``: of every key), from
        the table."""
        import pyarrow.dataset as ds

        dataset = table.to_pyarrow_dataset()
        current = dataset.to_table(
            filter=ds.field(CURRENT) == True)  # noqa: E712 - a dataset expression, not a bool
        if not every_key and current.num_rows:
            # The batch's keys are matched here, not pushed into the scan: a string key is
            # string_view on one side of the scan's statistics pruning and string on the
            # other, and pyarrow has no kernel comparing the two.
            mask = None
            for key in keys:
                column = current.column(key)
                values = pc.unique(rows.column(key)).cast(column.type)
                match = pc.is_in(column, value_set=values)
                mask = match if mask is None else pc.and_(mask, match)
            current = current.filter(mask)
        found = current.to_pylist()
        return {tuple(row[k] for k in keys): row for row in found}


def _truncate_closes(changes: list[dict[str, Any]], current: dict[tuple[Any, ...], Any],
                     keys: list[str], valid_from: str, truncates: Sequence[Truncate],
                     time_type: pa.DataType) -> list[dict[str, Any]]:
    """For each truncate, a delete at its position and time for every key that may have an
    open version then: the table's current keys and the keys of the batch's earlier changes
    (``_versions`` ignores a delete of a key without an open version)."""
    naive = pa.types.is_timestamp(time_type) and time_type.tz is None
    closes: list[dict[str, Any]] = []
    for truncate in truncates:
        at = truncate.at.astimezone(dt.UTC).replace(tzinfo=None) if naive else truncate.at
        open_keys = set(current) | {tuple(c[k] for k in keys) for c in changes
                                    if c[POSITION_COLUMN] < truncate.position}
        closes += [{**dict(zip(keys, key, strict=True)), POSITION_COLUMN: truncate.position,
                    DELETED_COLUMN: True, valid_from: at} for key in sorted(open_keys, key=str)]
    return closes


#: About how many rows the first write of an upsert table puts in one file.
CLUSTER_ROWS = 65_536


def _clustered(rows: pa.Table, keys: Sequence[str]) -> tuple[pa.Table, int]:
    """The first write of an upsert table (a rebuild's rows): in key order, in files of about
    ``CLUSTER_ROWS`` rows, so that a later merge of a few keys reads and rewrites only the
    files whose key range holds them (delta-rs skips a file whose key statistics exclude
    every key of the merge, ``key_filter``) instead of one file of the whole table. Returns
    the rows and the file size, which the table keeps as ``delta.targetFileSize`` so that
    merges write files of that size too (without it, a merge of many keys rewrites the table
    into one file, and every later merge reads it all)."""
    if not rows.num_rows:
        return rows, 4 << 20
    # Parquet holds these rows in about a third of their Arrow size.
    size = max(1 << 20, rows.nbytes * CLUSTER_ROWS // rows.num_rows // 3)
    if rows.num_rows <= CLUSTER_ROWS:
        return rows, size
    return rows.sort_by([(key, "ascending") for key in keys]), size


#: The most distinct values of a key column a merge names to its target (``key_filter``).
FILTER_KEYS = 1_000


def key_filter(source: pa.Table, keys: Sequence[str]) -> str:
    """Conjuncts naming the target rows a merge of ``source`` can match: per integer or text
    key column, its values in ``source`` (and NULL where ``source`` has one). ANDed with the
    key equality they exclude no match, and delta-rs skips every file whose key statistics
    exclude them all, where without them it reads the whole table (a 1M-row table: 0.15 to 0.35 s
    for one changed key, 0.025 s with them, in files of ``CLUSTER_ROWS``). '' where no column
    qualifies (another type, more than ``FILTER_KEYS`` values, text a literal cannot hold
    plainly)."""
    parts = []
    for key in keys:
        column = source.column(key)
        kind = column.type
        values = pc.unique(column.drop_null()).to_pylist()
        if len(values) > FILTER_KEYS:
            continue
        if pa.types.is_integer(kind):
            literals = [str(int(v)) for v in values]
        elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
            if any("\\" in v or "\x00" in v for v in values):
                continue
            literals = ["'" + v.replace("'", "''") + "'" for v in values]
        else:
            continue
        name = f"t.{quote_identifier(key)}"
        alternatives = [f"{name} IN ({', '.join(literals)})"] if literals else []
        if column.null_count:
            alternatives.append(f"{name} IS NULL")
        if alternatives:  # none: an empty batch, which matches nothing anyway
            parts.append("(" + " OR ".join(alternatives) + ")")
    return " AND ".join(parts)


def _cast_like(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """The batch with the table's types for the columns the table has."""
    columns = []
    fields = []
    for field in rows.schema:
        column = rows.column(field.name)
        index = schema.get_field_index(field.name)
        if index >= 0 and schema.field(index).type != field.type:
            column = column.cast(schema.field(index).type)
            field = pa.field(field.name, schema.field(index).type)
        columns.append(column)
        fields.append(field)
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _scd2_schema(output: pa.Schema, valid_from: str) -> pa.Schema:
    fields = [f for f in output if f.name not in (DELETED_COLUMN, valid_from)]
    time_type = output.field(valid_from).type
    return pa.schema([*fields, pa.field(VALID_FROM, time_type), pa.field(VALID_TO, time_type),
                      pa.field(CURRENT, pa.bool_())])


def _with_action(table: pa.Table, action: str) -> pa.Table:
    return table.append_column("_action", pa.array([action] * table.num_rows, pa.string()))


def _versions(
    changes: list[dict[str, Any]], keys: list[str], attributes: list[str], valid_from: str,
    current: dict[tuple[Any, ...], dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Turn a batch of changes into (versions to close, versions to insert)."""
    by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for change in changes:
        key = tuple(change[k] for k in keys)
        if any(v is None for v in key):
            raise TargetError(f"an SCD2 change has a null key {dict(zip(keys, key, strict=True))}")
        by_key[key].append(change)
    closes: list[dict[str, Any]] = []
    inserts: list[dict[str, Any]] = []
    for key, key_changes in by_key.items():
        key_changes.sort(key=lambda c: c[POSITION_COLUMN])
        open_row = current.get(key)
        open_is_new = False
        for change in key_changes:
            deleted = bool(change.get(DELETED_COLUMN))
            if not deleted and open_row is not None and \
                    all(open_row.get(a) == change.get(a) for a in attributes):
                continue  # nothing tracked changed
            if open_row is None and deleted:
                continue
            if open_row is not None:
                if open_is_new:
                    open_row[VALID_TO] = change[valid_from]
                    open_row[CURRENT] = False
                else:
                    closes.append({**open_row, VALID_TO: change[valid_from], CURRENT: False})
                open_row = None
            if not deleted:
                version = {c: change.get(c) for c in (*keys, *attributes, POSITION_COLUMN)}
                version.update({VALID_FROM: change[valid_from], VALID_TO: None, CURRENT: True})
                inserts.append(version)
                open_row, open_is_new = version, True
    return closes, inserts


class DeltaGenerationTarget(GenerationTarget):
    """One generation's Delta table, as the ``Target`` protocol sees it (``_targets``): a
    batch is one Delta transaction carrying ``Transaction(projection@generation, batch id)``
    (``DeltaViewWriter``). Deletes and truncates need the keyed mode (``upsert``): the other
    modes keep history."""

    kind = "delta"

    def __init__(self, spec: DeltaTableTarget, location: str, context: TargetContext) -> None:
        super().__init__(location, context)
        self.spec = spec
        self.writer = DeltaViewWriter(spec, location,
                                      app_id=f"{context.projection}@{context.generation}",
                                      name=context.projection)

    @property
    def keys(self) -> tuple[str, ...]:
        return self.spec.keys

    @property
    def max_driver_rows(self) -> int | None:
        # An append batch goes through the Spark sink; an upsert or SCD2 batch is merged
        # from the driver unless it is large (see ``DeltaViewWriter``).
        return 0 if self.spec.mode == "append" else DRIVER_MERGE_ROWS

    def write(self, rows: pa.Table, batch: TargetBatch, *,
              rejected: Rejected | None = None) -> bool:
        missing = [k for k in self.spec.keys if k not in rows.column_names]
        if missing:
            raise TargetError(f"rows for {self.location} lack the key columns {missing}")
        if self.spec.mode == "scd2":
            result = self.writer.write_scd2(rows, batch.batch_id, truncates=batch.truncates)
        elif self.spec.mode == "append":
            result = self.writer.append_arrow(rows, batch.batch_id)
        else:
            result = self.writer.write_arrow(rows, batch.batch_id,
                                             replace=bool(batch.truncates))
        return not result.skipped

    def write_frame(self, df: DataFrame, batch: TargetBatch) -> bool:
        return not self.writer.write(df, batch.batch_id, truncates=batch.truncates).skipped

    def _keyed(self, what: str) -> DeltaTable | None:
        if self.spec.mode != "upsert":
            raise IncompatibleTargetError(
                f"a Delta {self.spec.mode} target keeps history: it cannot {what}; use "
                "delta_table('upsert', keys=[...])"
            )
        return self.writer._open()

    def delete(self, keys: pa.Table, batch: TargetBatch) -> bool:
        if self._keyed("delete keys") is None:
            return False  # no table yet: nothing to delete
        return super().delete(keys, batch)

    def truncate(self, batch: TargetBatch) -> bool:
        if not batch.truncates:
            raise TargetError("truncate() needs a batch with at least one truncate")
        table = self._keyed("truncate")
        if table is None:
            return False  # no table yet: nothing to remove
        schema = pa.schema(table.schema().to_arrow())
        empty = pa.Table.from_pylist([], schema=pa.schema([schema.field(k)
                                                           for k in self.spec.keys]))
        return not self.writer.write_arrow(empty, batch.batch_id, replace=True).skipped

    def read(self, keys: Sequence[object]) -> dict[str, dict[str, Any]]:
        from lakefold.projections.definitions._codec import key_text

        table = self.writer._open()
        if table is None or not keys:
            return {}
        import pyarrow.dataset as ds

        key = self.spec.keys[0]
        dataset = table.to_pyarrow_dataset()
        values = pa.array(list(keys)).cast(dataset.schema.field(key).type)
        found = dataset.to_table(filter=ds.field(key).isin(values)).to_pylist()
        return {key_text(row[key]): row for row in found}

    def stored_keys(self) -> list[object]:
        table = self.writer._open()
        if table is None:
            return []
        held: list[object] = table.to_pyarrow_table(
            columns=[self.spec.keys[0]]).column(0).to_pylist()
        return held

    def checkpoint(self) -> int | None:
        table = self.writer._open()
        return None if table is None else table.transaction_version(self.writer.app_id)

    def repair(self, rows: pa.Table, position: int) -> None:
        """A merge under its own app id (``projection@generation/part``): the batch
        sequence's app transaction stays where it is."""
        import time

        writer = DeltaViewWriter(self.spec, self.location,
                                 app_id=f"{self.writer.app_id}/part", name=self.writer.name)
        if DELETED_COLUMN not in rows.column_names:
            rows = rows.append_column(DELETED_COLUMN,
                                      pc.cast(pa.nulls(rows.num_rows), pa.bool_()))
        writer.write_arrow(rows, int(time.time() * 1000))

    @classmethod
    def drop_storage(cls, location: str, context: TargetContext) -> None:
        import shutil

        if "://" in location:  # an object store: delete every object under the prefix
            fs, root = filesystem_for(location)
            fs.delete_dir_contents(root, missing_dir_ok=True)
            return
        shutil.rmtree(location, ignore_errors=True)
