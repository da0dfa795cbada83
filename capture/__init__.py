"""Capture: logical replication (pgoutput) into durable, compacted changelog streams.

Write side: ``Capture(CaptureConfig(...)).run()`` reads the source's WAL through a replication
slot and a publication that lakefold owns, and appends every change to one changelog stream
per table, confirming the slot only after the store has the records.

Snapshots and operations (``_snapshot``, ``_resnapshot``, ``_health``, ``_control``): the
initial snapshot runs when the slot is created (``CaptureConfig.snapshot``);
``resnapshot(config, tables)`` re-reads tables while streaming; ``slot_health(config)``,
``pause_capture`` / ``resume_capture`` and ``recover(config)`` after an invalidated slot.

Read side: ``ChangelogStore(store_dsn)`` (``streams``, ``head``, ``read``, ``read_events``,
``follow``, ``stream_schema``, ``compact``) and ``read_changelog_range`` for Spark workers.
Durable readers (``commit_reader``, ``release_reader``, ``readers``) hold compaction back at
the position they have processed; ``compaction_state`` says what holds a stream, and
``keep_history`` keeps a stream's full history (no compaction) for history readers.
Positions start at 1; ``read``'s ``from_position`` is inclusive; ranges are ``[start, end)``.
"""

from lakefold.capture._capture import Capture, CaptureStats
from lakefold.capture._config import CaptureConfig, CompactionPolicy
from lakefold.capture._control import pause as pause_capture
from lakefold.capture._control import resume as resume_capture
from lakefold.capture._health import (
    SlotHealth,
    SlotInvalidatedError,
    recover,
    slot_health,
)
from lakefold.capture._options import HealthThresholds, HeartbeatPolicy, SnapshotPolicy
from lakefold.capture._pgoutput import format_lsn, parse_lsn
from lakefold.capture._readers import CompactionState, ReaderPosition
from lakefold.capture._resnapshot import resnapshot
from lakefold.capture._snapshot import SnapshotListener, SnapshotStats
from lakefold.capture._store import (
    META_SCHEMA,
    ChangelogStore,
    StreamInfo,
    read_changelog_range,
)
from lakefold.capture._types import ColumnSchema, StreamSchema
from lakefold.capture._values import Interval
from lakefold.capture.exceptions import (
    CaptureConfigurationError,
    CaptureError,
    CaptureRunningError,
    ConnectionLostError,
    DecodingError,
    OwnershipError,
    OwnershipLostError,
    ReaderBehindCompactionError,
    SlotError,
    SourceConfigurationError,
    StoreError,
    StoreUnavailableError,
    UnknownStreamError,
)

__all__: list[str] = [
    "META_SCHEMA",
    "Capture",
    "CaptureConfig",
    "CaptureConfigurationError",
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
