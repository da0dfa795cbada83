"""Options of the capture's snapshot, heartbeat and slot-health features (values only, no I/O).

``SnapshotPolicy``   how the initial snapshot and re-snapshots copy existing rows.
``HeartbeatPolicy``  how often the capture writes a heartbeat into the source's WAL.
``HealthThresholds`` when slot health turns from ``ok`` to ``warning`` or ``critical``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from lakefold.capture.exceptions import CaptureConfigurationError


@dataclass(frozen=True, slots=True)
class SnapshotPolicy:
    """How existing rows are copied into the changelog streams.

    ``initial``: when the capture creates its slot, copy every captured table's rows inside
    the slot's exported snapshot before streaming (``read`` records first, then every change
    after the slot's consistent point: no gap, no duplicate).
    ``chunk_rows`` / ``chunk_bytes``: rows are copied in primary-key chunks of at most this
    many rows (incremental chunks also stop at about ``chunk_bytes`` of row data); each chunk
    is committed with its progress, so an interrupted snapshot resumes after its last chunk.
    ``workers``: chunks of the initial snapshot copied in parallel (each with its own
    connections, all inside the same exported snapshot).
    ``incremental_chunk_rows``: rows per chunk of an incremental snapshot (those rows stay
    share-locked while the chunk is read, so keep it small).
    ``lock_retries``: how often an incremental chunk retries rows that were locked by writers
    (``FOR SHARE SKIP LOCKED``) before it waits for each such row's lock (``lock_timeout``).
    """

    initial: bool = True
    chunk_rows: int = 50_000
    chunk_bytes: int = 8 << 20
    incremental_chunk_rows: int = 2_000
    workers: int = 2
    lock_retries: int = 50
    lock_timeout: timedelta = timedelta(seconds=30)

    def __post_init__(self) -> None:
        if self.chunk_rows < 1 or self.incremental_chunk_rows < 1:
            raise CaptureConfigurationError(
                "snapshot chunk_rows and incremental_chunk_rows must be at least 1")
        if self.chunk_bytes < 1024:
            raise CaptureConfigurationError(f"snapshot chunk_bytes must be at least 1024, not "
                                     f"{self.chunk_bytes}")
        if self.workers < 1:
            raise CaptureConfigurationError(
                f"snapshot workers must be at least 1, not {self.workers}")
        if self.lock_retries < 0:
            raise CaptureConfigurationError("snapshot lock_retries must not be negative")


@dataclass(frozen=True, slots=True)
class HeartbeatPolicy:
    """Every ``interval`` while capturing, write a tiny logical decoding message
    (``pg_logical_emit_message``, prefix ``lakefold.heartbeat``) on the source, so the slot's
    confirmed LSN advances even when no captured table changes while other tables (or other
    databases of the server) write WAL. The last ``keep`` heartbeats are kept in the store:
    they map LSNs to times and give the capture's lag in seconds."""

    interval: timedelta = timedelta(seconds=10)
    keep: int = 360

    def __post_init__(self) -> None:
        if self.interval <= timedelta(0):
            raise CaptureConfigurationError(
                f"heartbeat interval must be positive, not {self.interval}")
        if self.keep < 1:
            raise CaptureConfigurationError("heartbeat keep must be at least 1")


@dataclass(frozen=True, slots=True)
class HealthThresholds:
    """When a slot's health is reported as ``warning`` (the first value) or ``critical``
    (the second): lag in bytes and seconds behind the source's WAL, and ``safe_wal_size``
    (bytes the server can still write before it invalidates the slot) below a floor."""

    lag_bytes: tuple[int, int] = (1 << 30, 8 << 30)
    lag_seconds: tuple[float, float] = (300.0, 3600.0)
    safe_wal_bytes: tuple[int, int] = (4 << 30, 1 << 30)

    def __post_init__(self) -> None:
        for name, (warn, crit) in (("lag_bytes", self.lag_bytes),
                                   ("lag_seconds", self.lag_seconds)):
            if warn < 0 or crit < warn:
                raise CaptureConfigurationError(
                    f"{name} thresholds must be (warning, critical) with 0 <= warning <= "
                    f"critical, got ({warn}, {crit})")
        warn, crit = self.safe_wal_bytes
        if crit < 0 or warn < crit:
            raise CaptureConfigurationError(
                "safe_wal_bytes thresholds must be (warning, critical) with warning >= "
                f"critical >= 0 (less headroom is worse), got ({warn}, {crit})")
