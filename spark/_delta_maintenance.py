"""Table maintenance: compact small files (optimize) and delete unreferenced files (vacuum).

Streaming micro-batches leave many small files; ``optimize_table`` rewrites them into files of
about ``target_size`` bytes in one commit that changes no row (``dataChange=false``), so
streaming readers and the app transactions are unaffected. ``vacuum_table`` deletes files no
longer referenced by any version inside the retention window: removed files, orphans of
batches that crashed before their commit, and stale merge staging directories.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pyarrow.fs as pafs
from deltalake.exceptions import DeltaError

from lakefold.core.object_store import filesystem_for
from lakefold.spark._delta_commit import require_table
from lakefold.spark._delta_read import PartitionFilter
from lakefold.spark._delta_sink import STAGING_DIR
from lakefold.spark._delta_target import normalize_table_uri
from lakefold.spark.exceptions import SparkTerminalError

DEFAULT_RETENTION_HOURS = 168  # Delta's default: a week of time travel stays readable


@dataclass(frozen=True)
class OptimizeResult:
    """What a compaction did; ``version`` is the table version afterwards."""

    path: str
    version: int
    files_added: int
    files_removed: int
    partitions_optimized: int


@dataclass(frozen=True)
class VacuumResult:
    """Files deleted (or, with ``dry_run``, that would be deleted), relative to the table."""

    path: str
    dry_run: bool
    files: tuple[str, ...]


def optimize_table(path: str, *, target_size: int | None = None,
                   partition_filters: list[PartitionFilter] | None = None) -> OptimizeResult:
    """Compact small files into larger ones; the table's rows are unchanged."""
    uri = normalize_table_uri(path)
    table = require_table(uri)
    if target_size is not None and target_size <= 0:
        raise SparkTerminalError(f"target size must be positive, got {target_size}")
    try:
        if partition_filters:
            metrics = table.optimize.compact(
                partition_filters=partition_filters, target_size=target_size
            )
        else:
            metrics = table.optimize.compact(target_size=target_size)
    except DeltaError as e:
        raise SparkTerminalError(f"optimizing {uri} failed: {e}") from e
    table.update_incremental()
    return OptimizeResult(
        path=uri,
        version=table.version(),
        files_added=int(metrics.get("numFilesAdded", 0)),
        files_removed=int(metrics.get("numFilesRemoved", 0)),
        partitions_optimized=int(metrics.get("partitionsOptimized", 0)),
    )


def _stale_staging(uri: str, retention_hours: float) -> list[str]:
    fs, root = filesystem_for(uri)
    selector = pafs.FileSelector(f"{root}/{STAGING_DIR}", allow_not_found=True)
    cutoff_ns = (time.time() - retention_hours * 3600) * 1e9
    stale = []
    for info in fs.get_file_info(selector):
        if info.type != pafs.FileType.Directory:
            continue
        mtime = info.mtime_ns
        if mtime is None:
            # An object store has no directories, so no directory times: the newest file
            # under it says when the staging was last written (none: an empty prefix).
            inside = fs.get_file_info(pafs.FileSelector(info.path, recursive=True))
            mtime = max((f.mtime_ns or 0 for f in inside), default=0)
        if mtime <= cutoff_ns:
            stale.append(info.path)
    return stale


def vacuum_table(path: str, *, retention_hours: float = DEFAULT_RETENTION_HOURS,
                 dry_run: bool = False, enforce_retention: bool = True) -> VacuumResult:
    """Delete files older than ``retention_hours`` that no table version in the window uses.

    Versions older than the window can no longer be read (time travel stops there). A
    retention below Delta's configured minimum is refused unless ``enforce_retention`` is
    false: a short retention can delete the files of a batch that is being written right now.
    """
    uri = normalize_table_uri(path)
    table = require_table(uri)
    if retention_hours < 0:
        raise SparkTerminalError(f"retention must be 0 hours or more, got {retention_hours}")
    if retention_hours != int(retention_hours):
        # delta-rs counts whole hours: 1.5 would keep one hour, less than asked.
        raise SparkTerminalError(
            f"retention is counted in whole hours, got {retention_hours}; pass "
            f"{int(retention_hours) + 1} to keep at least that long")
    try:
        removed = table.vacuum(
            retention_hours=int(retention_hours),
            dry_run=dry_run,
            enforce_retention_duration=enforce_retention,
            full=True,  # also orphans of batches that crashed before their commit
        )
    except DeltaError as e:
        raise SparkTerminalError(
            f"vacuum of {uri} refused: {e}; pass a longer retention, or disable the "
            "retention check if no writer is running"
        ) from e
    stale = _stale_staging(uri, retention_hours)
    if not dry_run:
        fs, _ = filesystem_for(uri)
        for directory in stale:
            fs.delete_dir(directory)
    prefix_len = len(filesystem_for(uri)[1]) + 1
    return VacuumResult(
        path=uri,
        dry_run=dry_run,
        files=tuple([*removed, *(d[prefix_len:] + "/" for d in stale)]),
    )
