"""Driver side of a Delta write: one transaction per batch, exactly once.

Every commit carries ``Transaction(app_id, batch_id)``. delta-rs does not refuse a version it
has seen, so each attempt first refreshes the snapshot and reads
``transaction_version(app_id)``: a batch at or below it is already in the table and is skipped.
A commit that loses a race with another writer (``CommitFailedError``) is retried from a fresh
snapshot, up to ``CommitPolicy.attempts`` times, then surfaces as ``DeltaCommitConflictError``
(transient). Two writers of the same app id conflict in delta-rs's own check, and the loser
then finds the winner's version and skips: the batch lands once.

Adding columns (schema evolution) is its own metadata-only commit just before the data commit;
it changes no row, and a retry after a crash finds the columns present and goes on.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
from deltalake import DeltaTable, Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

from lakefold.core.object_store import check_object_store, object_store_for, storage_options_for
from lakefold.spark._delta_files import WrittenFile
from lakefold.spark._delta_schema import WritePlan
from lakefold.spark._delta_target import DeltaTarget, WriteMode
from lakefold.spark.exceptions import (
    DeltaCommitConflictError,
    NotADeltaTableError,
    SchemaMergeError,
    SparkTerminalError,
)

T = TypeVar("T")


@dataclass(frozen=True)
class CommitPolicy:
    """How hard to retry a commit that lost a race with another writer."""

    attempts: int = 8
    first_backoff_s: float = 0.05
    max_backoff_s: float = 2.0


def open_table(uri: str, *, version: int | None = None) -> DeltaTable | None:
    """The Delta table at ``uri``, or None when nothing is there yet.

    Raises NotADeltaTableError when ``uri`` is a non-empty local directory (or a file) that is
    not a Delta table: writing there would mix Delta files into someone else's data.
    """
    try:
        return DeltaTable(uri, version=version, storage_options=storage_options_for(uri))
    except TableNotFoundError:
        local = Path(uri)
        if "://" not in uri and local.exists() and (not local.is_dir() or any(local.iterdir())):
            raise NotADeltaTableError(
                f"{uri} exists but is not a Delta table (no _delta_log); point the target at "
                "an empty directory or an existing Delta table"
            ) from None
        return None
    except (DeltaError, OSError) as e:
        explain_store_failure(uri)
        raise SparkTerminalError(f"cannot open the Delta table at {uri}: {e}") from e


def explain_store_failure(uri: str) -> None:
    """After a failed Delta operation on ``uri``: when it lives in a registered object store
    that refuses the credentials, lacks the bucket or does not answer, raise that as one
    ObjectStoreError line naming the setting (delta-rs's own message is a long chain)."""
    store = object_store_for(uri)
    if store is not None:
        check_object_store(store)


def require_table(uri: str, *, version: int | None = None) -> DeltaTable:
    """The Delta table at ``uri``; NotADeltaTableError when there is none."""
    table = open_table(uri, version=version)
    if table is None:
        raise NotADeltaTableError(
            f"{uri} is not a Delta table (no _delta_log); check the path or the table name"
        )
    return table


def batch_properties(app_id: str, batch_id: int) -> CommitProperties:
    """The commit properties that record ``batch_id`` of ``app_id`` in the table's log (the
    commit's own proof, read back by ``is_committed``)."""
    return CommitProperties(app_transactions=[Transaction(app_id, batch_id)])


def is_committed(table: DeltaTable, app_id: str, batch_id: int) -> bool:
    """True when ``app_id`` has committed ``batch_id`` or a later batch to ``table``."""
    done = table.transaction_version(app_id)
    return done is not None and done >= batch_id


def create_table(target: DeltaTarget, schema: pa.Schema) -> DeltaTable:
    """Create the table (version 0, no data) unless another writer just did."""
    try:
        return DeltaTable.create(
            target.path,
            schema,
            storage_options=storage_options_for(target.path),
            mode="ignore",
            partition_by=list(target.partition_by) or None,
            name=target.name,
            description=target.description,
            configuration=dict(target.configuration) or None,
        )
    except (DeltaError, OSError) as e:
        explain_store_failure(target.path)
        raise SparkTerminalError(f"cannot create the Delta table at {target.path}: {e}") from e


def _with_retry(target: DeltaTarget, table: DeltaTable, batch_id: int, policy: CommitPolicy,
                attempt_once: Callable[[DeltaTable], None]) -> tuple[bool, int]:
    """Run ``attempt_once`` until it commits; (skipped, attempts)."""
    backoff = policy.first_backoff_s
    for attempt in range(1, policy.attempts + 1):
        table.update_incremental()
        if is_committed(table, target.app_id, batch_id):
            return True, attempt
        try:
            attempt_once(table)
        except CommitFailedError as e:
            if attempt == policy.attempts:
                raise DeltaCommitConflictError(
                    f"batch {batch_id} of {target.app_id!r} lost {attempt} commit races on "
                    f"{target.path}; another writer keeps committing: retry the batch later"
                ) from e
            time.sleep(backoff * (0.5 + random.random()))  # noqa: S311 - jitter, not crypto
            backoff = min(backoff * 2, policy.max_backoff_s)
            continue
        except DeltaError as e:
            raise SparkTerminalError(
                f"committing batch {batch_id} of {target.app_id!r} to {target.path} failed: {e}"
            ) from e
        return False, attempt
    raise AssertionError("unreachable")  # pragma: no cover


def _add_columns(table: DeltaTable, plan: WritePlan) -> tuple[str, ...]:
    """Add the plan's new columns that the table still lacks (one metadata-only commit)."""
    present = {f.name for f in table.schema().fields}
    missing = [f for f in plan.new_columns if f.name not in present]
    if missing:
        try:
            table.alter.add_columns(missing)
        except DeltaError as e:
            raise SchemaMergeError(
                f"cannot add column(s) {', '.join(f.name for f in missing)} to "
                f"{table.table_uri}: {e}"
            ) from e
    return tuple(f.name for f in missing)


CommitOutcome = tuple[bool, int, tuple[str, ...]]  # (skipped, attempts, columns added)


def commit_files(table: DeltaTable, target: DeltaTarget, batch_id: int, plan: WritePlan,
                 files: Sequence[WrittenFile], policy: CommitPolicy) -> CommitOutcome:
    """Commit task-written files (append or overwrite) as one transaction.

    Returns (skipped, attempts, columns added). A skipped batch's files are left for the caller
    to delete.
    """
    actions: list[AddAction | RemoveAction] = [
        AddAction(f.path, f.size, f.partition_values, f.modification_time, True, f.stats)
        for f in files
    ]
    mode = "overwrite" if target.mode is WriteMode.OVERWRITE else "append"
    added: tuple[str, ...] = ()

    def attempt_once(current: DeltaTable) -> None:
        nonlocal added
        if mode == "append":
            added = added or _add_columns(current, plan)
        current.create_write_transaction(
            actions,
            mode,
            DeltaSchema.from_arrow(plan.table_schema),
            partition_by=list(target.partition_by) or None,
            commit_properties=batch_properties(target.app_id, batch_id),
        )

    skipped, attempts = _with_retry(target, table, batch_id, policy, attempt_once)
    return skipped, attempts, added


def quote_identifier(name: str) -> str:
    """A column name as a DataFusion SQL identifier (delta-rs merge predicates)."""
    return '"' + name.replace('"', '""') + '"'


def keys_match(keys: Sequence[str]) -> str:
    """The merge predicate matching a source row to the target row with the same key, NULL
    included (``=`` never matches NULL: a NULL key would be inserted again at every merge,
    and never deleted). As fast as ``=`` (a hash join either way, measured on 1M rows)."""
    # Parenthesised: DataFusion binds IS NOT DISTINCT FROM more loosely than AND.
    return " AND ".join(
        f"(t.{quote_identifier(k)} IS NOT DISTINCT FROM s.{quote_identifier(k)})" for k in keys)


def commit_merge(table: DeltaTable, target: DeltaTarget, batch_id: int, plan: WritePlan,
                 source: pa.Table, policy: CommitPolicy) -> CommitOutcome:
    """Merge ``source`` by key (upsert, delete, or upsert with tombstones) as one transaction.

    An empty source commits only the app transaction, so the batch id is recorded either way
    (with ``delete_unmatched``, it deletes every row in that transaction).
    """
    keys = target.keys
    predicate = keys_match(keys)
    flag = target.deleted_column
    tombstone = f"COALESCE(s.{quote_identifier(flag)}, false)" if flag else None
    updates = {quote_identifier(c): f"s.{quote_identifier(c)}" for c in plan.data_columns}
    added: tuple[str, ...] = ()

    def attempt_once(current: DeltaTable) -> None:
        nonlocal added
        added = added or _add_columns(current, plan)
        if source.num_rows == 0 and target.delete_unmatched:
            current.delete(commit_properties=batch_properties(target.app_id, batch_id))
            return
        if source.num_rows == 0:
            current.create_write_transaction(
                [], "append", current.schema(),
                partition_by=list(target.partition_by) or None,
                commit_properties=batch_properties(target.app_id, batch_id),
            )
            return
        merger = current.merge(
            source,
            predicate,
            source_alias="s",
            target_alias="t",
            commit_properties=batch_properties(target.app_id, batch_id),
        )
        if target.mode is WriteMode.DELETE:
            merger = merger.when_matched_delete()
        elif tombstone is not None:
            merger = (
                merger.when_matched_delete(predicate=tombstone)
                .when_matched_update(updates, predicate=f"NOT {tombstone}")
                .when_not_matched_insert(updates, predicate=f"NOT {tombstone}")
            )
        else:
            merger = merger.when_matched_update(updates).when_not_matched_insert(updates)
        if target.delete_unmatched:
            merger = merger.when_not_matched_by_source_delete()
        merger.execute()

    skipped, attempts = _with_retry(target, table, batch_id, policy, attempt_once)
    return skipped, attempts, added
