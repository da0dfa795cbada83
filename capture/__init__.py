"""Capture: logical replication (pgoutput) into durable, compacted changelog streams.

Write side: ``Capture(CaptureConfig(...)).run()`` reads the source's WAL through a replication
slot and a publication that lakefold owns, and appends every change to one changelog stream
per table, confirming the slot only after the store has the records.

Snapshots and operations: the initial snapshot runs when the slot is created
(``CaptureConfig.snapshot``); ``resnapshot(config, tables)`` re-reads tables while streaming;
``slot_health(config)``, ``pause_capture`` / ``resume_capture`` and ``recover(config)`` after an
invalidated slot.

Read side: ``ChangelogStore(store_dsn)`` (``streams``, ``head``, ``read``, ``read_events``,
``follow``, ``stream_schema``, ``compact``) and ``read_changelog_range`` for Spark workers.
Durable readers (``commit_reader``, ``release_reader``, ``readers``) hold compaction back at
the position they have processed; ``compaction_state`` says what holds a stream, and
``keep_history`` keeps a stream's full history (no compaction) for history readers.
Positions start at 1; ``read``'s ``from_position`` is inclusive; ranges are ``[start, end)``.

Rooms, lowest first (each imports only the ones before it):

``store``        the changelog store (reads, writer, compaction, durable readers, segments);
                 importable without the rest, which is what Spark's workers load
``decoding``     the replication connection, pgoutput and the decoder, in-band messages
``snapshots``    the initial snapshot, incremental snapshots, rows read again
``operations``   ``Capture`` and its loop, control, slot health and recovery, ownership, the
                 publication guard, the source's set-up

The names below are imported lazily (PEP 562): ``import lakefold.capture`` stays cheap, and a
reader of the store does not load the replication code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakefold.core.lazy import lazy_getattr

if TYPE_CHECKING:
    from lakefold.capture._config import (
        CaptureConfig,
    )
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
        CaptureError,
        CaptureRunningError,
        ConnectionLostError,
        DecodingError,
        InvalidConfigError,
        OwnershipError,
        OwnershipLostError,
        ReaderBehindCompactionError,
        SlotError,
        SourceConfigurationError,
        StoreError,
        StoreUnavailableError,
        UnknownStreamError,
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
    from lakefold.capture.store import (
        META_SCHEMA,
        ChangelogStore,
        ColumnSchema,
        CompactionPolicy,
        CompactionState,
        Interval,
        ReaderPosition,
        StreamInfo,
        StreamSchema,
        read_changelog_range,
    )

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
    "HealthThresholds": "lakefold.capture._options",
    "HeartbeatPolicy": "lakefold.capture._options",
    "SnapshotPolicy": "lakefold.capture._options",
    "SnapshotListener": "lakefold.capture.snapshots",
    "SnapshotStats": "lakefold.capture.snapshots",
    "resnapshot": "lakefold.capture.snapshots",
    "format_lsn": "lakefold.capture.decoding",
    "parse_lsn": "lakefold.capture.decoding",
    "META_SCHEMA": "lakefold.capture.store",
    "ChangelogStore": "lakefold.capture.store",
    "ColumnSchema": "lakefold.capture.store",
    "CompactionPolicy": "lakefold.capture.store",
    "CompactionState": "lakefold.capture.store",
    "Interval": "lakefold.capture.store",
    "ReaderPosition": "lakefold.capture.store",
    "StreamInfo": "lakefold.capture.store",
    "StreamSchema": "lakefold.capture.store",
    "read_changelog_range": "lakefold.capture.store",
    "CaptureError": "lakefold.capture.exceptions",
    "CaptureRunningError": "lakefold.capture.exceptions",
    "ConnectionLostError": "lakefold.capture.exceptions",
    "DecodingError": "lakefold.capture.exceptions",
    "InvalidConfigError": "lakefold.capture.exceptions",
    "OwnershipError": "lakefold.capture.exceptions",
    "OwnershipLostError": "lakefold.capture.exceptions",
    "ReaderBehindCompactionError": "lakefold.capture.exceptions",
    "SlotError": "lakefold.capture.exceptions",
    "SourceConfigurationError": "lakefold.capture.exceptions",
    "StoreError": "lakefold.capture.exceptions",
    "StoreUnavailableError": "lakefold.capture.exceptions",
    "UnknownStreamError": "lakefold.capture.exceptions",
}

__all__ = [
    "META_SCHEMA",
    "Capture",
    "CaptureConfig",
    "CaptureError",
    "CaptureRunningError",
    "CaptureStats",
    "ChangelogStore",
    "ColumnSchema",
    "CompactionPolicy",
    "CompactionState",
    "ConnectionLostError",
    "DecodingError",
    "HealthThresholds",
    "HeartbeatPolicy",
    "Interval",
    "InvalidConfigError",
    "OwnershipError",
    "OwnershipLostError",
    "ReaderBehindCompactionError",
    "ReaderPosition",
    "SlotError",
    "SlotHealth",
    "SlotInvalidatedError",
    "SnapshotListener",
    "SnapshotPolicy",
    "SnapshotStats",
    "SourceConfigurationError",
    "StoreError",
    "StoreUnavailableError",
    "StreamInfo",
    "StreamSchema",
    "UnknownStreamError",
    "format_lsn",
    "parse_lsn",
    "pause_capture",
    "read_changelog_range",
    "recover",
    "resnapshot",
    "resume_capture",
    "slot_health",
]

__getattr__ = lazy_getattr(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return __all__
