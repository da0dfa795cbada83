"""What a Delta write means: the target table, the write mode, the keys and the app transaction.

``DeltaTarget`` is the options object that every Delta write takes; ``WriteResult`` is what a
write reports back. Both are frozen values that cross the boundary between the projection layer
and the Spark layer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from lakefold.spark.exceptions import SparkTerminalError

_URI_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
# Spark's micro-batch ids are longs; Delta's txn.version is a long too.
_MAX_VERSION = 2**63 - 1


class WriteMode(StrEnum):
    """How a batch changes the table.

    - ``append``: add the rows.
    - ``upsert``: merge by ``keys``: update the matching rows, insert the others. With
      ``deleted_column`` set, rows whose flag is true are tombstones that delete by key. With
      ``delete_unmatched``, the table's rows whose key the batch does not name are deleted in
      the same transaction: the batch replaces the table's content (a truncated source).
    - ``delete``: every row is a tombstone: delete the table rows with the same keys.
    - ``overwrite``: replace the whole table with the batch (a rebuild generation, or a
      recomputed aggregate).
    """

    APPEND = "append"
    UPSERT = "upsert"
    DELETE = "delete"
    OVERWRITE = "overwrite"


def normalize_table_uri(path: str | Path) -> str:
    """An absolute local path, or a URI left as it is (``s3://...``).

    Spark's Python workers run in other processes, maybe on other hosts with the same shared
    file system, so a relative path would point elsewhere there.
    """
    text = str(path)
    if text.startswith("file://"):
        text = text.removeprefix("file://")
    elif _URI_SCHEME.match(text):
        return text.rstrip("/")
    if not text:
        raise SparkTerminalError("the Delta table path is empty; pass a directory path or a URI")
    return str(Path(text).expanduser().resolve())


@dataclass(frozen=True)
class DeltaTarget:
    """A Delta table and how batches are written to it.

    ``app_id`` names the writer in the table's app transactions (projection plus generation,
    e.g. ``"revenue@3"``); the batch id is the transaction version. A batch whose id is at or
    below the table's recorded version for ``app_id`` has been committed already and is
    skipped, which makes every write exactly once.

    ``order_by`` (upsert only) picks the surviving row when a batch holds several rows with the
    same key: the one with the greatest value wins. Without it, duplicate keys in one batch are
    an error, because which row should win is unknown.
    """

    path: str
    mode: WriteMode = WriteMode.APPEND
    app_id: str = "lakefold"
    keys: tuple[str, ...] = ()
    partition_by: tuple[str, ...] = ()
    order_by: str | None = None
    deleted_column: str | None = None
    delete_unmatched: bool = False
    # Delta table name and description, recorded in the table's metadata at creation.
    name: str | None = None
    description: str | None = None
    configuration: dict[str, str] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", normalize_table_uri(self.path))
        try:
            object.__setattr__(self, "mode", WriteMode(self.mode))
        except ValueError:
            known = ", ".join(m.value for m in WriteMode)
            raise SparkTerminalError(
                f"unknown Delta write mode {self.mode!r}; use one of {known}"
            ) from None
        object.__setattr__(self, "keys", tuple(self.keys))
        object.__setattr__(self, "partition_by", tuple(self.partition_by))
        if not self.app_id or not self.app_id.strip():
            raise SparkTerminalError("DeltaTarget.app_id is empty; use projection plus generation")
        keyed = self.mode in (WriteMode.UPSERT, WriteMode.DELETE)
        if keyed and not self.keys:
            raise SparkTerminalError(
                f"mode {self.mode.value!r} needs keys: pass DeltaTarget(keys=('id',), ...)"
            )
        if not keyed and (self.keys and self.mode is not WriteMode.APPEND):
            raise SparkTerminalError(
                f"keys are only used by upsert and delete, not {self.mode.value}")
        if self.order_by is not None and self.mode is not WriteMode.UPSERT:
            raise SparkTerminalError("order_by is only used by mode 'upsert'")
        if self.deleted_column is not None and self.mode is not WriteMode.UPSERT:
            raise SparkTerminalError("deleted_column is only used by mode 'upsert'")
        if self.delete_unmatched and self.mode is not WriteMode.UPSERT:
            raise SparkTerminalError("delete_unmatched is only used by mode 'upsert'")
        for group, names in (("keys", self.keys), ("partition_by", self.partition_by)):
            if len(set(names)) != len(names):
                raise SparkTerminalError(f"DeltaTarget.{group} names a column twice: {names}")
        if self.deleted_column is not None and self.deleted_column in self.keys:
            raise SparkTerminalError("deleted_column cannot also be a key column")

    @property
    def is_local(self) -> bool:
        """True when the table lives on the local (or a shared, mounted) file system."""
        return not _URI_SCHEME.match(self.path)

    def check_batch_id(self, batch_id: int) -> int:
        """The batch id as a Delta transaction version, or a clear error."""
        if isinstance(batch_id, bool) or not isinstance(batch_id, int):
            raise SparkTerminalError(f"batch id must be an int, got {type(batch_id).__name__}")
        if not 0 <= batch_id <= _MAX_VERSION:
            raise SparkTerminalError(f"batch id must be between 0 and 2**63-1, got {batch_id}")
        return batch_id


@dataclass(frozen=True)
class WriteResult:
    """What one ``write_batch`` did.

    ``skipped`` is true when the batch had been committed before (same app id, version at or
    above the batch id): nothing was written. ``table_version`` is the table version after the
    write (the commit's version, or the current one for a skip).
    """

    path: str
    app_id: str
    batch_id: int
    skipped: bool
    table_version: int
    files_added: int = 0
    rows_written: int = 0
    commit_attempts: int = 0
    columns_added: tuple[str, ...] = ()
