"""Capture: logical replication (pgoutput) into durable, compacted changelog streams.

Write side: ``Capture(CaptureConfig(...)).run()`` reads the source's WAL through a replication
slot and a publication that lakefold owns, and appends every change to one changelog stream
per table, confirming the slot only after the store has the records.

Snapshots and operations: the initial snapshot runs when the slot is created
(``CaptureConfig.snapshot``); ``resnapshot(config, tables)`` re-reads tables while streaming;
``slot_health(config)``, ``pause_capture`` / ``resume_capture`` and ``recover(config)`` after an
invalidated slot.

Read side: ``ChangelogStore(store_dsn)`` and ``read_changelog_range`` (Spark's workers), with
durable readers that hold compaction back: see ``lakefold.store`` (the store the capture,
the event store's feeds and the views share), whose names are exported here too.

Rooms, lowest first (each imports only the ones before it):

``decoding``     the replication connection, pgoutput and the decoder, in-band messages
``snapshots``    the initial snapshot, incremental snapshots, rows read again
``operations``   ``Capture`` and its loop, control, slot health and recovery, ownership, the
                 publication guard, the source's set-up

The names below are imported lazily (PEP 562): ``import lakefold.capture`` stays cheap, and a
reader of the store does not load the replication code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import lakefold.store as _store  # cheap: the store's own names load lazily
from lakefold.core.lazy import lazy_getattr

if TYPE_CHECKING:
    from lakefold.capture._config import LEGACY_SLOT, CaptureConfig, slot_name_for
    from lakefold.capture._options import (
        HealthThresholds,
        HeartbeatPolicy,
        SnapshotPolicy,
    )
    from lakefold.capture.decoding import (
        format_lsn,
        parse_lsn,
    )
    from lakefold.capture.exceptions import (
        CaptureConfigurationError,
        CaptureError,
        CaptureRunningError,
        ConnectionLostError,
        DecodingError,
        OwnershipError,
        OwnershipLostError,
        SlotError,
        SourceConfigurationError,
    )
    from lakefold.capture.operations import (
        Capture,
        CaptureStats,
        SlotHealth,
        SlotInvalidatedError,
        pause_capture,
        recover,
        resume_capture,
        slot_health,
    )
    from lakefold.capture.snapshots import (
        SnapshotListener,
        SnapshotStats,
        resnapshot,
    )
    from lakefold.store import *  # noqa: F403 (the names in store.__all__)

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "Capture": "lakefold.capture.operations",
    "CaptureStats": "lakefold.capture.operations",
    "SlotHealth": "lakefold.capture.operations",
    "SlotInvalidatedError": "lakefold.capture.operations",
    "pause_capture": "lakefold.capture.operations",
    "recover": "lakefold.capture.operations",
    "resume_capture": "lakefold.capture.operations",
    "slot_health": "lakefold.capture.operations",
    "CaptureConfig": "lakefold.capture._config",
    "slot_name_for": "lakefold.capture._config",
    "LEGACY_SLOT": "lakefold.capture._config",
    "HealthThresholds": "lakefold.capture._options",
    "HeartbeatPolicy": "lakefold.capture._options",
    "SnapshotPolicy": "lakefold.capture._options",
    "SnapshotListener": "lakefold.capture.snapshots",
    "SnapshotStats": "lakefold.capture.snapshots",
    "resnapshot": "lakefold.capture.snapshots",
    "format_lsn": "lakefold.capture.decoding",
    "parse_lsn": "lakefold.capture.decoding",
    "CaptureError": "lakefold.capture.exceptions",
    "CaptureRunningError": "lakefold.capture.exceptions",
    "ConnectionLostError": "lakefold.capture.exceptions",
    "DecodingError": "lakefold.capture.exceptions",
    "CaptureConfigurationError": "lakefold.capture.exceptions",
    "OwnershipError": "lakefold.capture.exceptions",
    "OwnershipLostError": "lakefold.capture.exceptions",
    "SlotError": "lakefold.capture.exceptions",
    "SourceConfigurationError": "lakefold.capture.exceptions",
}
_EXPORTS |= dict.fromkeys(_store.__all__, "lakefold.store")

__all__ = [
    "LEGACY_SLOT",
    "Capture",
    "CaptureConfig",
    "CaptureConfigurationError",
    "CaptureError",
    "CaptureRunningError",
    "CaptureStats",
    "ConnectionLostError",
    "DecodingError",
    "HealthThresholds",
    "HeartbeatPolicy",
    "OwnershipError",
    "OwnershipLostError",
    "SlotError",
    "SlotHealth",
    "SlotInvalidatedError",
    "SnapshotListener",
    "SnapshotPolicy",
    "SnapshotStats",
    "SourceConfigurationError",
    "format_lsn",
    "parse_lsn",
    "pause_capture",
    "recover",
    "resnapshot",
    "resume_capture",
    "slot_health",
    "slot_name_for",
]
__all__ += _store.__all__

__getattr__ = lazy_getattr(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return __all__
