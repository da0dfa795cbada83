"""The exactly-once Delta sink: ``write_batch`` for batch jobs, ``delta_sink`` for streams.

One call writes one batch as one Delta transaction:

1. Open the table and read ``transaction_version(app_id)``. A batch at or below it was
   committed before (a replay after a crash): skip it without running any task.
2. Plan the schema (added columns, widened types); refuse an unmergeable batch before any file
   is written.
3. Spark tasks write Parquet (``mapInArrow``): straight into the table directory for append and
   overwrite, into a staging directory for merges. Only file descriptions reach the driver.
4. The driver commits: ``create_write_transaction`` of the files, or a delta-rs ``merge`` of the
   staged rows by key, with ``Transaction(app_id, batch_id)``; a lost race is retried.
5. Staging files are deleted; data files of a skipped batch are deleted. A crash between 3 and
   4 leaves unreferenced files that ``vacuum`` removes; the replayed batch writes new ones.

Why ``foreachBatch`` rather than a Python data source stream writer: the write needs the whole
micro-batch as a DataFrame (deduplicating keys across partitions before a merge, checking the
schema once), and its commit runs in the user's driver process, so a failed commit fails the
query with the real error. A ``DataSourceStreamWriter.commit`` runs in a separate Python worker
and sees only per-partition messages.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from lakefold.core.object_store import filesystem_for, storage_options_for
from lakefold.spark._delta_commit import (
    CommitPolicy,
    commit_files,
    commit_merge,
    create_table,
    is_committed,
    open_table,
)
from lakefold.spark._delta_files import (
    FILE_ROW_DDL,
    FileWriteSpec,
    WrittenFile,
    file_from_row,
    write_task_files,
)
from lakefold.spark._delta_schema import WritePlan, arrow_schema_of, plan_write
from lakefold.spark._delta_target import DeltaTarget, WriteMode, WriteResult
from lakefold.spark.exceptions import SparkTerminalError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

STAGING_DIR = "_lakefold_staging"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _staging_prefix(target: DeltaTarget, batch_id: int) -> str:
    app = _UNSAFE.sub("_", target.app_id)
    return f"{STAGING_DIR}/{app}-{batch_id}-{uuid.uuid4().hex[:12]}"


def _dedupe(df: DataFrame, target: DeltaTarget) -> DataFrame:
    """Keep, per key, the row with the greatest ``order_by`` value."""
    from pyspark.sql import Window, functions as F

    order = F.col(str(target.order_by)).desc_nulls_last()
    rank = "__lakefold_rank"
    window = Window.partitionBy(*target.keys).orderBy(order)
    return df.withColumn(rank, F.row_number().over(window)).filter(F.col(rank) == 1).drop(rank)


def _write_files(df: DataFrame, spec: FileWriteSpec) -> list[WrittenFile]:
    """Run the write tasks; return the files they wrote."""

    def task(batches):  # type: ignore[no-untyped-def]  # runs in Spark's Python workers
        return write_task_files(spec, batches)

    rows = df.mapInArrow(task, FILE_ROW_DDL).collect()
    return [file_from_row(row.asDict()) for row in rows]


def _delete_files(target: DeltaTarget, relative_paths: list[str]) -> None:
    fs, root = filesystem_for(target.path)
    for path in relative_paths:
        try:
            fs.delete_file(f"{root}/{path}")
        except FileNotFoundError:
            continue


def _delete_staging(target: DeltaTarget, prefix: str) -> None:
    fs, root = filesystem_for(target.path)
    try:
        fs.delete_dir(f"{root}/{prefix}")
    except FileNotFoundError:
        return


def _read_staged(target: DeltaTarget, prefix: str, files: list[WrittenFile],
                 plan: WritePlan) -> pa.Table:
    """The staged rows of a merge, checked: no null keys, no duplicate keys."""
    if not files:
        return plan.file_schema.empty_table()
    fs, root = filesystem_for(target.path)
    paths = [f"{root}/{f.path}" for f in files]
    source = pads.dataset(paths, format="parquet", filesystem=fs, schema=plan.file_schema)
    table = source.to_table()
    for key in target.keys:
        nulls = table.column(key).null_count
        if nulls:
            raise SparkTerminalError(
                f"{nulls} row(s) of the batch have a null key {key!r}; a merge by key needs "
                "every key set: filter or fill them before writing"
            )
    counts = table.group_by(list(target.keys)).aggregate([([], "count_all")])
    dupes = counts.filter(pc.greater(counts.column("count_all"), 1))
    if dupes.num_rows:
        sample = dupes.slice(0, 3).drop_columns(["count_all"]).to_pylist()
        raise SparkTerminalError(
            f"the batch has {dupes.num_rows} key(s) with more than one row (e.g. {sample}); "
            "set DeltaTarget(order_by=...) to keep the latest row per key, or deduplicate first"
        )
    return table


def write_batch(df: DataFrame, target: DeltaTarget, batch_id: int, *,
                policy: CommitPolicy | None = None) -> WriteResult:
    """Write ``df`` to ``target`` as batch ``batch_id``, exactly once.

    Guarantees: after it returns, the table holds the batch's effect exactly once, whatever
    happened before (crashes, replays of the same batch id); a batch that was committed before
    is skipped without writing; a bad batch (unmergeable schema, missing or null keys,
    duplicate keys without ``order_by``) raises before anything is committed.
    """
    batch_id = target.check_batch_id(batch_id)
    policy = policy or CommitPolicy()
    table = open_table(target.path)
    if table is not None and is_committed(table, target.app_id, batch_id):
        return WriteResult(target.path, target.app_id, batch_id, skipped=True,
                           table_version=table.version())
    plan = plan_write(
        target,
        arrow_schema_of(df.schema),
        table.schema() if table is not None else None,
        table.metadata().partition_columns if table is not None else None,
    )
    keyed = target.mode in (WriteMode.UPSERT, WriteMode.DELETE)
    if target.mode is WriteMode.UPSERT and target.order_by is not None:
        df = _dedupe(df, target)
    if target.mode is WriteMode.DELETE:
        df = df.select(*target.keys)
    prefix = _staging_prefix(target, batch_id) if keyed else ""
    spec = FileWriteSpec(
        table_uri=target.path,
        prefix=prefix,
        schema=plan.file_schema,
        partition_by=() if keyed else target.partition_by,
        storage_options=storage_options_for(target.path),
    )
    files = _write_files(df, spec)
    try:
        if table is None:
            create_schema = plan.table_schema
            table = create_table(target, create_schema)
        if keyed:
            source = _read_staged(target, prefix, files, plan)
            skipped, attempts, added = commit_merge(table, target, batch_id, plan, source, policy)
            rows = source.num_rows
        else:
            skipped, attempts, added = commit_files(table, target, batch_id, plan, files, policy)
            rows = sum(f.num_records for f in files)
            if skipped:
                _delete_files(target, [f.path for f in files])
    finally:
        if keyed:
            _delete_staging(target, prefix)
    table.update_incremental()
    return WriteResult(
        target.path,
        target.app_id,
        batch_id,
        skipped=skipped,
        table_version=table.version(),
        files_added=0 if skipped or keyed else len(files),
        rows_written=0 if skipped else rows,
        commit_attempts=attempts,
        columns_added=added,
    )


def delta_sink(target: DeltaTarget, *, policy: CommitPolicy | None = None,
               on_result: Callable[[WriteResult], None] | None = None
               ) -> Callable[[DataFrame, int], None]:
    """A ``foreachBatch`` function writing each micro-batch with ``write_batch``.

    ``df.writeStream.foreachBatch(delta_sink(target)).option("checkpointLocation", ...)``:
    Spark replays an unfinished micro-batch with the same id after a restart, and the app
    transaction makes the replay a no-op when it had been committed already.
    """

    def write(df: DataFrame, batch_id: int) -> None:
        result = write_batch(df, target, batch_id, policy=policy)
        if on_result is not None:
            on_result(result)

    return write
