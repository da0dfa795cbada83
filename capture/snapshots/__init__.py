"""Snapshots: the existing rows of captured tables as ``read`` records in their streams.

Inside: the initial snapshot taken when the slot is created (``_initial_snapshot``), incremental
snapshots that re-read tables while the capture streams (``_incremental_snapshot``), single rows
read again in-band (``_reread``), and what a snapshot needs to know about a source table
(``_table_shape``).
"""

from lakefold.capture.snapshots._incremental_snapshot import (
    plan_resnapshot,
    resnapshot,
    run_locked,
)
from lakefold.capture.snapshots._initial_snapshot import SnapshotListener, SnapshotStats

__all__ = ["SnapshotListener", "SnapshotStats", "plan_resnapshot", "resnapshot", "run_locked"]
