"""The log of a Delta table read as a projection input (``_source_delta``): what each
version's commit says, and how the version is therefore read (``plan_version``).

A version's commit (``_delta_log/<version>.json``) is parsed once per process and kept
(``DeltaCommit``: its data-changing adds and removes, its change data files, the table
properties and schema it sets, its time). ``plan_version`` decides: ``cdf`` (change data
files, or removes while the change data feed is on: delta-rs's change data feed reader),
``append`` (adds only: the added files), ``skip`` (no data change: OPTIMIZE), ``refused``
(removes without the feed), ``reshaped`` (a schema that does not continue the one before:
``schema_change``), ``snapshot`` (an input's ``starting_version``: the whole table then).
``refusal`` is the one-line error of the last two.

Table handles and storage options: one long-lived handle per table and process
(``current_table``, moved to the newest version on each call), options from the caller (a
Spark worker gets them as a source option) or else this process's object-store registry.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

import pyarrow as pa

from lakefold.spark._source_inputs import DeltaSource
from lakefold.spark.exceptions import DeltaInputError, NotADeltaTableError

if TYPE_CHECKING:
    from deltalake import DeltaTable

_CDF_PROPERTY: Final = "delta.enableChangeDataFeed"

Storage = Mapping[str, str] | None
Kind = Literal["cdf", "append", "skip", "refused", "reshaped", "snapshot"]


# ------------------------------------------------------------------------------- the table


_lock = threading.Lock()
_tables: dict[str, DeltaTable] = {}
_commits: dict[tuple[str, int], DeltaCommit] = {}
_configs: dict[tuple[str, int], dict[str, str]] = {}
_change_rows: dict[tuple[str, int], int] = {}
#: Commits and properties kept per process (a version's commit never changes).
_CACHED: Final = 20_000


def _remember(cache: dict[Any, Any], key: Any, value: Any) -> None:
    """Keep ``value`` in a per-process cache of at most ``_CACHED`` entries (oldest out)."""
    cache[key] = value
    while len(cache) > _CACHED:
        cache.pop(next(iter(cache)))


def storage_options(uri: str, storage: Storage) -> dict[str, str] | None:
    if storage is not None:
        return dict(storage)
    from lakefold.core.object_store import storage_options_for

    return storage_options_for(uri)


def open_input_table(uri: str, storage: Storage = None) -> DeltaTable:
    """The Delta table at ``uri`` (a fresh handle); DeltaInputError when there is none."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError, TableNotFoundError

    try:
        return DeltaTable(uri, storage_options=storage_options(uri, storage))
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


def current_table(uri: str, storage: Storage) -> DeltaTable:
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
    return int(current_table(source.uri, storage).version())


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
    #: Added and removed files whose action carries no row count (statistics).
    uncounted: tuple[str, ...] = ()
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
    uncounted: list[str] = []
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
                counted = _stats_rows(add)
                add_rows += counted
                if not counted:
                    uncounted.append(str(add["path"]))
        elif "remove" in action:
            remove = action["remove"]
            if remove.get("dataChange", True):
                removes += 1
                counted = _stats_rows(remove)
                remove_rows += counted
                if not counted:
                    uncounted.append(str(remove["path"]))
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
                       removes=removes, remove_rows=remove_rows,
                       uncounted=tuple(uncounted), cdc=tuple(cdc),
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

    fs, root = filesystem_for(source.uri, storage_options(source.uri, storage))
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
        return VersionPlan(version, "cdf", change_rows(source, commit, storage), commit)
    if commit.removes:
        return VersionPlan(version, "refused", 0, commit)
    if commit.adds:
        return VersionPlan(version, "append", change_rows(source, commit, storage), commit)
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


def data_file(source: DeltaSource, path: str, storage: Storage) -> tuple[Any, str]:
    """The file system and path of a data file a commit names (relative to the table's root,
    URI-encoded, or absolute)."""
    from urllib.parse import unquote

    from lakefold.core.object_store import filesystem_for

    location = unquote(path)
    if "://" in location:
        return filesystem_for(location, storage_options(source.uri, storage))
    fs, root = filesystem_for(source.uri, storage_options(source.uri, storage))
    return fs, f"{root.rstrip('/')}/{location}"


def change_rows(source: DeltaSource, commit: DeltaCommit, storage: Storage) -> int:
    """About how many change rows a version holds: the rows of its change data files
    (pre-images of updates included), or else of the files it adds and removes (the commit's
    statistics, or the files' Parquet footers); kept per process."""
    key = (source.uri, commit.version)
    with _lock:
        known = _change_rows.get(key)
    if known is not None:
        return known
    if commit.cdc:
        total = _footer_rows(source, commit.cdc, storage)
    else:
        total = commit.add_rows + commit.remove_rows \
            + _footer_rows(source, commit.uncounted, storage)
    with _lock:
        _remember(_change_rows, key, total)
    return total


def _footer_rows(source: DeltaSource, paths: tuple[str, ...], storage: Storage) -> int:
    import pyarrow.parquet as pq

    total = 0
    for path in paths:
        fs, location = data_file(source, path, storage)
        try:
            total += int(pq.read_metadata(location, filesystem=fs).num_rows)
        except (OSError, pa.ArrowInvalid):
            total += 1  # an estimate only: reading the version says what is wrong
    return total


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
