"""A Delta table as a projection input: every committed version of the table, as change rows.

The input (``DeltaSource``, built by ``lakefold.projections.delta_changes``) reads the table's
history version by version, with delta-rs, through the projection source (``_source_records``)
like a changelog: the same record metadata columns (``_source_columns``), then ``_op``
(``insert``, ``update`` or ``delete``), ``_commit_version`` and ``_commit_ts``, then the table's
columns. An insert and an update carry the row after the change, a delete the row before it.

What a version holds is read from its commit in ``_delta_log`` (``DeltaCommit``):

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
record limit allows (estimated from the commit's file statistics). Reads of a committed
version are final, so a micro-batch replayed after a crash holds the same rows: the targets'
batch ids make the effect exactly once.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc

from lakefold.schemas.arrow import conform_batch, spark_compatible
from lakefold.spark._source_columns import META_FIELDS
from lakefold.spark._source_inputs import DeltaSource
from lakefold.spark._source_positions import PositionRange, ReadOptions
from lakefold.spark.exceptions import (
    DeltaInputColumnError,
    DeltaInputError,
    NotADeltaTableError,
    SparkTerminalError,
)

if TYPE_CHECKING:
    from deltalake import DeltaTable

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
_CDF_PROPERTY: Final = "delta.enableChangeDataFeed"

Storage = Mapping[str, str] | None
Kind = Literal["cdf", "append", "skip", "refused", "reshaped", "snapshot"]


# ------------------------------------------------------------------------------- positions


def first_position(version: int) -> int:
    """The position of the first row of ``version`` (and the end of the version before)."""
    return (version + 1) * VERSION_STRIDE


def version_at(position: int) -> int:
    """The version a position belongs to (the offsets 0 .. ``VERSION_STRIDE``: version 0)."""
    return max(0, position // VERSION_STRIDE - 1)


delta_version_at = version_at  # its name in ``lakefold.spark.internals``


# ------------------------------------------------------------------------------- the table


_lock = threading.Lock()
_tables: dict[str, DeltaTable] = {}
_commits: dict[tuple[str, int], DeltaCommit] = {}
_configs: dict[tuple[str, int], dict[str, str]] = {}
#: Commits and properties kept per process (a version's commit never changes).
_CACHED: Final = 20_000


def _remember(cache: dict[Any, Any], key: Any, value: Any) -> None:
    """Keep ``value`` in a per-process cache of at most ``_CACHED`` entries (oldest out)."""
    cache[key] = value
    while len(cache) > _CACHED:
        cache.pop(next(iter(cache)))


def _options(uri: str, storage: Storage) -> dict[str, str] | None:
    if storage is not None:
        return dict(storage)
    from lakefold.core.object_store import storage_options_for

    return storage_options_for(uri)


def open_input_table(uri: str, storage: Storage = None) -> DeltaTable:
    """The Delta table at ``uri`` (a fresh handle); DeltaInputError when there is none."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError, TableNotFoundError

    try:
        return DeltaTable(uri, storage_options=_options(uri, storage))
    except TableNotFoundError:
        raise NotADeltaTableError(
            f"{uri} is not a Delta table (no _delta_log there); delta_changes() reads a table "
            "that delta-spark, delta-rs or another Delta writer created: check the path") from None
    except (DeltaError, OSError) as e:
        raise DeltaInputError(f"cannot open the Delta table at {uri}: "
                              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
                              ) from e


def table_at(source: DeltaSource, version: int, storage: Storage = None) -> DeltaTable:
    """The table as of ``version``; DeltaInputError (one line) when it cannot be loaded."""
    from deltalake.exceptions import DeltaError

    table = open_input_table(source.uri, storage)
    try:
        table.load_as_version(version)
    except (DeltaError, OSError, ValueError) as e:
        raise DeltaInputError(
            f"cannot load version {version} of delta table {source.uri} "
            f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); its versions are "
            "listed by DESCRIBE HISTORY (log retention removes old ones)") from e
    return table


def _table(uri: str, storage: Storage) -> DeltaTable:
    """A long-lived handle per table in this process, moved to the latest version."""
    with _lock:
        table = _tables.get(uri)
    if table is None:
        table = open_input_table(uri, storage)
        with _lock:
            _tables[uri] = table
    else:
        table.update_incremental()
    return table


def latest_version(source: DeltaSource, storage: Storage = None) -> int:
    """The table's newest version."""
    return int(_table(source.uri, storage).version())


def head(source: DeltaSource, storage: Storage = None) -> int:
    """The last position readers may see: the end of the newest version, minus one."""
    return first_position(latest_version(source, storage) + 1) - 1


def table_arrow_schema(source: DeltaSource, storage: Storage = None) -> pa.Schema:
    """The table's columns now (newest version), as Spark can take them."""
    table = _table(source.uri, storage)
    return spark_compatible(pa.schema(table.schema().to_arrow()))


def arrow_schema(source: DeltaSource, storage: Storage = None) -> pa.Schema:
    """The columns an input frame has: metadata, change columns, the table's columns."""
    return pa.schema([*META_FIELDS, *CHANGE_FIELDS, *table_arrow_schema(source, storage)])


def check_delta_table(source: DeltaSource, storage: Storage = None) -> list[str]:
    """The table's column names, after checking that it can be read as asked: a Delta table,
    with no reader feature lakefold cannot read, with the key columns, without columns that
    clash with the input's own. DeltaInputError (one line) otherwise."""
    from lakefold.spark._delta_read import _unsupported_features

    table = _table(source.uri, storage)
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
    clash = sorted(_RESERVED.intersection(columns))
    if clash:
        raise DeltaInputError(
            f"delta table {source.uri} has column(s) {clash}, names the change rows use for "
            "their own columns; rename them in the table, or read it through a view of it")
    return columns


# ------------------------------------------------------------------------------- the log


@dataclass(frozen=True)
class DeltaCommit:
    """What one version of the table's log says (``_delta_log/<version>.json``)."""

    version: int
    operation: str
    timestamp_ms: int | None
    adds: tuple[str, ...] = ()
    add_partitions: tuple[Mapping[str, str | None], ...] = ()
    add_rows: int = 0
    removes: int = 0
    remove_rows: int = 0
    cdc: tuple[str, ...] = ()
    #: The table properties this version sets (None: it sets none).
    configuration: Mapping[str, str] | None = None
    #: The schema this version sets, as Arrow (None: it sets none).
    schema: pa.Schema | None = None


def _stats_rows(action: Mapping[str, Any]) -> int:
    stats = action.get("stats")
    if not stats:
        return 0
    try:
        return int(json.loads(stats).get("numRecords") or 0)
    except (ValueError, TypeError, AttributeError):
        return 0


def _parse_commit(version: int, text: str) -> DeltaCommit:
    adds: list[str] = []
    partitions: list[Mapping[str, str | None]] = []
    cdc: list[str] = []
    add_rows = removes = remove_rows = 0
    operation, timestamp = "?", None
    configuration: Mapping[str, str] | None = None
    schema: pa.Schema | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if "add" in action:
            add = action["add"]
            if add.get("dataChange", True):
                adds.append(str(add["path"]))
                partitions.append(dict(add.get("partitionValues") or {}))
                add_rows += _stats_rows(add)
        elif "remove" in action:
            remove = action["remove"]
            if remove.get("dataChange", True):
                removes += 1
                remove_rows += _stats_rows(remove)
        elif "cdc" in action:
            cdc.append(str(action["cdc"]["path"]))
        elif "commitInfo" in action:
            info = action["commitInfo"]
            operation = str(info.get("operation", "?"))
            stamp = info.get("inCommitTimestamp", info.get("timestamp"))
            timestamp = int(stamp) if stamp is not None else None
        elif "metaData" in action:
            meta = action["metaData"]
            configuration = dict(meta.get("configuration") or {})
            if meta.get("schemaString"):
                from deltalake import Schema

                schema = pa.schema(Schema.from_json(meta["schemaString"]).to_arrow())
    return DeltaCommit(version=version, operation=operation, timestamp_ms=timestamp,
                       adds=tuple(adds), add_partitions=tuple(partitions), add_rows=add_rows,
                       removes=removes, remove_rows=remove_rows, cdc=tuple(cdc),
                       configuration=configuration, schema=schema)


def read_commit(source: DeltaSource, version: int, storage: Storage = None) -> DeltaCommit:
    """The commit of ``version`` (cached: a commit never changes); DeltaInputError when the
    log no longer has it (log retention removed it)."""
    key = (source.uri, version)
    with _lock:
        found = _commits.get(key)
    if found is not None:
        return found
    from lakefold.core.object_store import filesystem_for

    fs, root = filesystem_for(source.uri, _options(source.uri, storage))
    path = f"{root.rstrip('/')}/_delta_log/{version:020d}.json"
    try:
        with fs.open_input_stream(path) as stream:
            text = bytes(stream.read()).decode()
    except FileNotFoundError:
        raise DeltaInputError(
            f"version {version} of delta table {source.uri} is no longer in its log "
            "(delta.logRetentionDuration removed it), so its changes cannot be read; start "
            "the input later with delta_changes(..., starting_version=<a version still in "
            "DESCRIBE HISTORY>) and rebuild the projection") from None
    commit = _parse_commit(version, text)
    with _lock:
        _remember(_commits, key, commit)
    return commit


def configuration_at(source: DeltaSource, version: int, storage: Storage = None
                     ) -> Mapping[str, str]:
    """The table properties as of ``version`` (its own commit's included)."""
    key = (source.uri, version)
    with _lock:
        known = _configs.get(key)
        before = _configs.get((source.uri, version - 1))
    if known is not None:
        return known
    commit = read_commit(source, version, storage)
    if commit.configuration is not None:
        config = dict(commit.configuration)
    elif before is not None:
        config = before
    else:
        config = dict(table_at(source, version, storage).metadata().configuration)
    with _lock:
        _remember(_configs, key, config)
    return config


@dataclass(frozen=True)
class VersionPlan:
    """How one version is read, and about how many rows it holds."""

    version: int
    kind: Kind
    rows: int
    commit: DeltaCommit | None = None
    #: Of a ``reshaped`` version: what changed in the table's columns.
    change: str | None = None


def plan_version(source: DeltaSource, version: int, storage: Storage = None) -> VersionPlan:
    """How ``version`` is read (see the module docstring)."""
    if source.starting_version is not None and version == source.starting_version:
        table = table_at(source, version, storage)
        rows = sum(int(n or 0) for n in pa.table(table.get_add_actions()).column(
            "num_records").to_pylist())
        return VersionPlan(version, "snapshot", rows)
    commit = read_commit(source, version, storage)
    if commit.schema is not None and version > 0:
        change = schema_change(source, _schema_at(source, version - 1, storage), commit.schema)
        if change is not None:
            return VersionPlan(version, "reshaped", 0, commit, change)
    cdf = configuration_at(source, version, storage).get(_CDF_PROPERTY, "false").lower() \
        == "true"
    if commit.cdc or (commit.removes and cdf):
        return VersionPlan(version, "cdf", commit.add_rows + commit.remove_rows
                           + 2 * len(commit.cdc), commit)
    if commit.removes:
        return VersionPlan(version, "refused", 0, commit)
    if commit.adds:
        return VersionPlan(version, "append", commit.add_rows, commit)
    return VersionPlan(version, "skip", 0, commit)


def _schema_at(source: DeltaSource, version: int, storage: Storage) -> pa.Schema:
    return pa.schema(table_at(source, version, storage).schema().to_arrow())


def widens(have: pa.DataType, need: pa.DataType) -> bool:
    """Whether every value of type ``have`` is read as the same value of type ``need``: the
    same type, or a widening (Delta's type widening: a larger integer or float, an integer to
    a double, a decimal with more digits, a date to a timestamp; a view or large string)."""
    t = pa.types
    if have == need:
        return True
    if t.is_integer(have) and t.is_integer(need):
        return bool(need.bit_width >= have.bit_width
                    and (t.is_signed_integer(need) or not t.is_signed_integer(have))
                    and not (t.is_signed_integer(need) and not t.is_signed_integer(have)
                             and need.bit_width == have.bit_width))
    if t.is_floating(have) and t.is_floating(need):
        return bool(need.bit_width >= have.bit_width)
    if t.is_integer(have) and t.is_floating(need):
        return bool(need.bit_width == 64)
    if t.is_decimal(have) and t.is_decimal(need):
        return bool(need.scale >= have.scale
                    and need.precision - need.scale >= have.precision - have.scale)
    if t.is_date(have) and t.is_timestamp(need):
        return True
    if t.is_timestamp(have) and t.is_timestamp(need):
        return True
    texts = (t.is_string, t.is_large_string, t.is_string_view)
    if any(f(have) for f in texts) and any(f(need) for f in texts):
        return True
    return str(have) == str(need)  # nested types: only the very same


def schema_change(source: DeltaSource, before: pa.Schema, after: pa.Schema) -> str | None:
    """What makes ``after`` unreadable as a continuation of ``before`` (a key column gone, a
    column's type changed other than by widening); None when rows read on (added columns,
    other columns dropped: read as null)."""
    for key in source.key:
        if key in before.names and key not in after.names:
            return f"drops key column {key!r}"
    for field_ in before:
        if field_.name in after.names:
            new = after.field(field_.name).type
            if not widens(field_.type, new):
                return f"changes column {field_.name!r} from {field_.type} to {new}"
    return None


def refusal(source: DeltaSource, plan: VersionPlan) -> DeltaInputError:
    """The one-line error for a version that cannot be read on from the one before: it
    removes data without the change data feed, or changes the columns incompatibly."""
    operation = plan.commit.operation if plan.commit is not None else "?"
    if plan.kind == "reshaped":
        return DeltaInputError(
            f"version {plan.version} of delta table {source.uri} ({operation}) {plan.change}, "
            "so the rows before it and after it cannot go on into one projection; rebuild "
            f"the projection from there with delta_changes(..., starting_version={plan.version})"
            " (the table as of that version, then its changes), or undo the change in the "
            "table")
    uri = source.uri.replace("`", "``")
    return DeltaInputError(
        f"version {plan.version} of delta table {source.uri} ({operation}) removes or rewrites "
        "rows, but the table's change data feed was off, so which rows it deleted or updated "
        "cannot be read (only appends can); turn the feed on for later changes with ALTER "
        f"TABLE delta.`{uri}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true), and "
        f"start this input after it with delta_changes(..., starting_version={plan.version}) "
        "(the table as of that version, then its changes) and a rebuild")


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
    """About how many change rows the versions of ``[start, end)`` hold (file statistics)."""
    if end <= start:
        return 0
    first, last = first_version(source, start), version_at(end - 1)
    return sum(plan_version(source, v, storage).rows for v in range(first, last + 1))


# ------------------------------------------------------------------------------- the rows


def _cdf_rows(source: DeltaSource, version: int, storage: Storage) -> pa.Table:
    from deltalake.exceptions import DeltaError

    table = _table(source.uri, storage)
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

    from lakefold.core.object_store import filesystem_for

    fs, root = filesystem_for(source.uri, _options(source.uri, storage))
    parts = []
    for path, partition in zip(commit.adds, commit.add_partitions, strict=True):
        location = unquote(path)
        if "://" in location:
            fs_file, location = filesystem_for(location, _options(source.uri, storage))
        else:
            fs_file, location = fs, f"{root.rstrip('/')}/{location}"
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
