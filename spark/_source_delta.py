"""A Delta table as a projection input: every committed version of the table, as change rows.

The input (``DeltaSource``, built by ``lakefold.projections.delta_changes``) reads the table's
history version by version, with delta-rs, through the projection source (``_source_records``)
like a changelog: the same record metadata columns (``_source_columns``), then ``_op``
(``insert``, ``update`` or ``delete``), ``_commit_version`` and ``_commit_ts``, then the table's
columns. An insert and an update carry the row after the change, a delete the row before it.

What a version holds is read from its commit in ``_delta_log`` (``_source_delta_log``):

- a version with change data files (``cdc``), or one that removes data files while the table's
  change data feed is on (``delta.enableChangeDataFeed``), is read through delta-rs's change
  data feed reader (``DeltaTable.load_cdf``): ``insert``, ``update_postimage`` (as ``update``)
  and ``delete`` rows; ``update_preimage`` rows are left out;
- a version that only adds data files (an append) is read from those files, CDF or not;
- a version that changes no data (OPTIMIZE, ZORDER, a property change: ``dataChange`` false)
  holds no rows, so compacted files are never read twice;
- a version that removes data files without the change data feed (a DELETE, UPDATE, MERGE or
  overwrite copied files) is refused (``DeltaInputError``, one line saying what to run):
  delta-rs would read it as "every row of the rewritten files deleted and inserted again",
  silently wrong. A micro-batch ends before such a version, so everything before it is
  applied and the projection stops on it.

With ``starting_version`` the input starts with the whole table as of that version (every row
an insert) and goes on with the versions after it.

Positions: the offset is the table version. The rows of version ``v`` have positions
``(v + 1) * VERSION_STRIDE + i``, ``i`` their place in the version (deletes first, then updates,
then inserts, each by key: a version that deletes and re-inserts a key ends with the insert),
so positions grow with the table's commit order and a replayed version gets the same ones. A
micro-batch holds whole versions (never part of one), at least one, and as many more as its
record limit allows (rows counted from the commits: statistics, or the files' Parquet
footers). Reads of a committed version are final, so a micro-batch replayed after a crash
holds the same rows: the targets' batch ids make the effect exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from lakefold.schemas.arrow import conform_batch, spark_compatible
from lakefold.spark._source_columns import META_FIELDS
from lakefold.spark._source_delta_log import (
    DeltaCommit,
    Storage,
    VersionPlan,
    current_table,
    data_file,
    latest_version,
    plan_version,
    read_commit,
    refusal,
    table_at,
    widens,
)
from lakefold.spark._source_inputs import DeltaSource
from lakefold.spark._source_positions import PositionRange, ReadOptions
from lakefold.spark.exceptions import DeltaInputColumnError, DeltaInputError, SparkTerminalError

#: Positions per table version: a version holds fewer change rows than this.
VERSION_STRIDE: Final = 1 << 32
#: At most this many versions in one micro-batch (planning reads each one's commit).
MAX_VERSIONS_PER_BATCH: Final = 1_000
#: The change columns after the record metadata columns.
CHANGE_FIELDS: Final = [
    pa.field("_op", pa.string()),
    pa.field("_commit_version", pa.int64()),
    pa.field("_commit_ts", pa.timestamp("us", tz="UTC")),
]
_RESERVED: Final = frozenset(f.name for f in (*META_FIELDS, *CHANGE_FIELDS))
_RANK: Final = {"delete": 0, "update": 1, "insert": 2}
_CDF_TYPES: Final = {"insert": "insert", "update_postimage": "update", "delete": "delete"}


# ------------------------------------------------------------------------------- positions


def first_position(version: int) -> int:
    """The position of the first row of ``version`` (and the end of the version before)."""
    return (version + 1) * VERSION_STRIDE


def version_at(position: int) -> int:
    """The version a position belongs to (the offsets 0 .. ``VERSION_STRIDE``: version 0)."""
    return max(0, position // VERSION_STRIDE - 1)


delta_version_at = version_at  # its name in ``lakefold.spark.internals``


# ------------------------------------------------------------------------------- the table


def head(source: DeltaSource, storage: Storage = None) -> int:
    """The last position readers may see: the end of the newest version, minus one."""
    return first_position(latest_version(source, storage) + 1) - 1


def table_arrow_schema(source: DeltaSource, storage: Storage = None) -> pa.Schema:
    """The table's columns now (newest version), as Spark can take them."""
    table = current_table(source.uri, storage)
    return spark_compatible(pa.schema(table.schema().to_arrow()))


def arrow_schema(source: DeltaSource, storage: Storage = None) -> pa.Schema:
    """The columns an input frame has: metadata, change columns, the table's columns."""
    return pa.schema([*META_FIELDS, *CHANGE_FIELDS, *table_arrow_schema(source, storage)])


def check_delta_table(source: DeltaSource, storage: Storage = None) -> list[str]:
    """The table's column names, after checking that it can be read as asked: a Delta table,
    with no reader feature lakefold cannot read, with the key columns, without columns that
    clash with the input's own. DeltaInputError (one line) otherwise."""
    from lakefold.spark._delta_read import _unsupported_features

    table = current_table(source.uri, storage)
    unsupported = _unsupported_features(table)
    if unsupported:
        raise DeltaInputError(
            f"delta table {source.uri} uses reader feature(s) {sorted(unsupported)} that "
            "lakefold's change reader does not support; rewrite the table without them (for "
            "deletion vectors: ALTER TABLE ... SET TBLPROPERTIES "
            "(delta.enableDeletionVectors = false), then REORG TABLE ... APPLY (PURGE))")
    columns = list(pa.schema(table.schema().to_arrow()).names)
    missing = [k for k in source.key if k not in columns]
    if missing:
        raise DeltaInputColumnError(
            f"delta table {source.uri} has no column {missing[0]!r} (key={list(source.key)}); "
            f"its columns are {columns}")
    newest = int(table.version())
    if source.starting_version is not None and source.starting_version > newest:
        raise DeltaInputError(
            f"delta_changes({source.uri!r}, starting_version={source.starting_version}): the "
            f"table's newest version is {newest}; start at a version it has")
    clash = sorted(_RESERVED.intersection(columns))
    if clash:
        raise DeltaInputError(
            f"delta table {source.uri} has column(s) {clash}, names the change rows use for "
            "their own columns; rename them in the table, or read it through a view of it")
    return columns


def first_version(source: DeltaSource, position: int) -> int:
    """The first version to read from ``position`` on."""
    version = version_at(position)
    if source.starting_version is not None:
        version = max(version, source.starting_version)
    return version


def batch_end(source: DeltaSource, begin: int, end: int, limit: int | None,
              storage: Storage = None) -> int:
    """The end of the micro-batch from ``begin`` towards ``end`` (the head + 1): whole
    versions, at least one, at most ``limit`` rows (estimated) and
    ``MAX_VERSIONS_PER_BATCH`` versions; before a refused version, or raising its error when
    it is the first."""
    if begin >= end:
        return begin
    version, last = first_version(source, begin), version_at(end - 1)
    if version > last:
        return begin
    rows, current = 0, version
    while current <= last and current - version < MAX_VERSIONS_PER_BATCH:
        plan = plan_version(source, current, storage)
        if plan.kind in ("refused", "reshaped"):
            if current == version:
                raise refusal(source, plan)
            break
        if limit is not None and current > version and rows + plan.rows > limit:
            break
        rows += plan.rows
        current += 1
    return first_position(current)


def batch_ranges(source: DeltaSource, start: int, end: int, options: ReadOptions,
                 storage: Storage = None) -> list[PositionRange]:
    """The partitions of a batch ``[start, end)``: runs of whole versions of about
    ``partition_size`` rows, at most ``max_partitions`` of them."""
    if end <= start:
        return []
    first, last = first_version(source, start), version_at(end - 1)
    if first > last:
        return []
    versions = [plan_version(source, v, storage) for v in range(first, last + 1)]
    versions = [v for v in versions if v.kind != "skip"]
    if not versions:
        return []
    per_part = max(1, -(-len(versions) // options.max_partitions))
    groups: list[list[VersionPlan]] = [[]]
    for plan in versions:
        group = groups[-1]
        if group and (len(group) >= per_part or sum(p.rows for p in group) + plan.rows
                      > options.partition_size) and len(groups) < options.max_partitions:
            groups.append([])
        groups[-1].append(plan)
    return [PositionRange(first_position(g[0].version), first_position(g[-1].version + 1))
            for g in groups if g]


def batch_rows(source: DeltaSource, start: int, end: int, storage: Storage = None) -> int:
    """About how many change rows the versions of ``[start, end)`` hold (``change_rows``)."""
    if end <= start:
        return 0
    first, last = first_version(source, start), version_at(end - 1)
    return sum(plan_version(source, v, storage).rows for v in range(first, last + 1))


# ------------------------------------------------------------------------------- the rows


def _cdf_rows(source: DeltaSource, version: int, storage: Storage) -> pa.Table:
    from deltalake.exceptions import DeltaError

    table = current_table(source.uri, storage)
    try:
        reader = table.load_cdf(starting_version=version, ending_version=version)
        data = _plain(pa.table(reader.read_all()))
    except (DeltaError, OSError, ValueError) as e:
        raise DeltaInputError(
            f"cannot read the change data of version {version} of delta table {source.uri}: "
            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    change = pc.cast(data.column("_change_type"), pa.string())
    kept = pc.is_in(change, pa.array(list(_CDF_TYPES)))
    data = data.filter(kept)
    ops = [_CDF_TYPES[t] for t in pc.cast(data.column("_change_type"), pa.string()).to_pylist()]
    drop = [c for c in ("_change_type", "_commit_version", "_commit_timestamp")
            if c in data.column_names]
    return data.drop_columns(drop).append_column("_op", pa.array(ops, pa.string()))


def _plain(data: pa.Table) -> pa.Table:
    """``data`` without view types (delta-rs reads strings as ``string_view``, which some
    pyarrow kernels and Spark do not take)."""
    fields = []
    for f in data.schema:
        if pa.types.is_string_view(f.type):
            f = f.with_type(pa.string())
        elif pa.types.is_binary_view(f.type):
            f = f.with_type(pa.binary())
        fields.append(f)
    wanted = pa.schema(fields, metadata=data.schema.metadata)
    return data if wanted == data.schema else data.cast(wanted)


def _file_rows(source: DeltaSource, commit: DeltaCommit, storage: Storage,
               schema: pa.Schema) -> pa.Table:
    """The rows of the data files a version adds (an append), partition values included."""
    import pyarrow.parquet as pq

    parts = []
    for path, partition in zip(commit.adds, commit.add_partitions, strict=True):
        fs_file, location = data_file(source, path, storage)
        try:
            data = pq.read_table(location, filesystem=fs_file)
        except (OSError, pa.ArrowInvalid) as e:  # FileNotFoundError included
            raise DeltaInputError(
                f"cannot read data file {path} of version {commit.version} of delta table "
                f"{source.uri} ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                "a VACUUM with a retention shorter than the projection's lag removes the files "
                "of versions it has not read yet: rebuild it with delta_changes(..., "
                "starting_version=<the oldest version whose files are kept>)") from e
        for name, value in partition.items():
            if name in data.column_names:
                continue
            wanted = schema.field(name).type if name in schema.names else pa.string()
            column = pa.array([value] * data.num_rows, pa.string())
            data = data.append_column(name, pc.cast(column, wanted))
        parts.append(data)
    table = pa.concat_tables(parts, promote_options="permissive") if parts else \
        pa.table({})
    return table.append_column("_op", pa.array(["insert"] * table.num_rows, pa.string()))


def _snapshot_rows(source: DeltaSource, version: int, storage: Storage) -> pa.Table:
    from deltalake.exceptions import DeltaError

    try:
        data = pa.table(table_at(source, version, storage).to_pyarrow_table())
    except (DeltaError, OSError) as e:
        raise DeltaInputError(
            f"cannot read delta table {source.uri} as of version {version}: "
            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    return data.append_column("_op", pa.array(["insert"] * data.num_rows, pa.string()))


def _check_columns(source: DeltaSource, version: int, data: pa.Table,
                   wanted: pa.Schema) -> None:
    """Refuse a version whose columns no longer fit the input's (one line)."""
    for key in source.key:
        if key not in data.column_names:
            raise DeltaInputError(
                f"version {version} of delta table {source.uri} has no key column {key!r} "
                "(the table's schema changed); fix the table or the input's key= and rebuild "
                "the projection")
    for name in data.column_names:
        if name not in wanted.names or name == "_op":
            continue
        have, need = data.schema.field(name).type, wanted.field(name).type
        if not widens(have, need):
            raise DeltaInputError(
                f"column {name!r} of delta table {source.uri} is {have} at version {version} "
                f"but {need} when the projection started (the table's schema changed "
                "incompatibly); rebuild the projection (`lakefold rebuild`)")


def _ordered(data: pa.Table, key: tuple[str, ...]) -> pa.Table:
    ranks = pa.array([_RANK[op] for op in data.column("_op").to_pylist()], pa.int8())
    data = data.append_column("_rank", ranks)
    order = [("_rank", "ascending"), *((k, "ascending") for k in key)]
    try:
        data = data.sort_by(order)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        data = data.sort_by([("_rank", "ascending")])
    return data.drop_columns(["_rank"])


def read_version(source: DeltaSource, plan: VersionPlan, schema: pa.Schema,
                 storage: Storage = None) -> pa.RecordBatch | None:
    """The change rows of one version as a batch of ``schema`` (None: it holds none)."""
    if plan.kind == "skip":
        return None
    if plan.kind in ("refused", "reshaped"):
        raise refusal(source, plan)
    if plan.kind == "snapshot":
        data = _snapshot_rows(source, plan.version, storage)
    elif plan.kind == "cdf":
        data = _cdf_rows(source, plan.version, storage)
    else:
        assert plan.commit is not None  # noqa: S101 - an append plan carries its commit
        data = _file_rows(source, plan.commit, storage, schema)
    data = _plain(data)
    if not data.num_rows:
        return None
    _check_columns(source, plan.version, data, schema)
    data = _ordered(data, source.key)
    stamp_ms = plan.commit.timestamp_ms if plan.commit is not None else None
    if stamp_ms is None:
        stamp_ms = _version_timestamp(source, plan.version, storage)
    rows = data.num_rows
    if rows >= VERSION_STRIDE:
        raise DeltaInputError(f"version {plan.version} of delta table {source.uri} holds "
                              f"{rows} changes, more than one batch can number")
    ops = data.column("_op")
    stamp = pa.scalar(stamp_ms * 1000 if stamp_ms is not None else None,
                      pa.timestamp("us", tz="UTC"))
    start = first_position(plan.version)
    extra = {
        "_position": pa.array(range(start, start + rows), pa.int64()),
        "_ts": pa.array([stamp] * rows, pa.timestamp("us", tz="UTC")),
        "_type": ops,
        "_stream": pa.array([source.uri] * rows, pa.string()),
        "_deleted": pc.equal(ops, "delete"),
        "_commit_version": pa.array([plan.version] * rows, pa.int64()),
        "_commit_ts": pa.array([stamp] * rows, pa.timestamp("us", tz="UTC")),
    }
    for name, column in extra.items():
        data = data.append_column(name, column)
    try:
        return conform_batch(data, schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise DeltaInputError(
            f"version {plan.version} of delta table {source.uri} does not fit the input's "
            f"columns ({str(e).splitlines()[0]}); rebuild the projection") from e


def _version_timestamp(source: DeltaSource, version: int, storage: Storage) -> int | None:
    try:
        commit = read_commit(source, version, storage)
    except SparkTerminalError:
        return None
    return commit.timestamp_ms


def read_range(source: DeltaSource, positions: PositionRange, schema: pa.Schema,
               storage: Storage = None) -> Iterator[pa.RecordBatch]:
    """The change rows of the versions of ``positions``, version by version (in a task)."""
    if positions.end <= positions.start:
        return
    for version in range(first_version(source, positions.start),
                         version_at(positions.end - 1) + 1):
        batch = read_version(source, plan_version(source, version, storage), schema, storage)
        if batch is not None:
            yield batch
