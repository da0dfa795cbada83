"""Position ranges for the store sources: offsets, read limits and partition splitting.

Both stores number their records with dense positions starting at 1 (the changelog leaves
holes after compaction, the event store after deletions, but never reuses a position). A
source offset is ``{"position": p}``: the next position to read, so a micro-batch reads the
half-open range ``[start.position, end.position)``. ``split_range`` cuts that range into
contiguous position ranges, one Spark partition each, read with one query per range.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lakefold.spark.exceptions import SparkTerminalError

OFFSET_KEY = "position"


@dataclass(frozen=True)
class PositionRange:
    """Positions ``start <= p < end`` of one partition."""

    start: int
    end: int

    def __len__(self) -> int:
        return max(0, self.end - self.start)


@dataclass(frozen=True)
class ReadOptions:
    """Source options shared by the changelog and event sources (all strings in Spark).

    - ``startingPosition``: first position to read (default 1, the beginning).
    - ``endingPosition`` (batch reads): stop before this position (default: the head + 1).
    - ``maxRecordsPerTrigger``: at most this many positions per micro-batch under
      processing-time triggers (``availableNow`` and batch reads take everything).
    - ``partitionSize``: positions per Spark partition (default 1,000,000: each partition
      costs a task and two connections, and reads stream at ~0.5-2M rows/s, so fewer, larger
      ranges win; a 2M-event micro-batch is two parallel reads, one per core here);
      ``maxPartitions``: at most this many partitions per batch (default 64).
    """

    starting_position: int = 1
    ending_position: int | None = None
    max_records_per_trigger: int | None = None
    partition_size: int = 1_000_000
    max_partitions: int = 64

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        """The options, validated; SparkLayerError names a bad one."""
        lowered = {k.lower(): v for k, v in options.items()}

        def number(name: str, default: int | None, minimum: int) -> int | None:
            raw = lowered.get(name.lower())
            if raw is None or raw == "":
                return default
            try:
                value = int(raw)
            except (TypeError, ValueError):
                raise SparkTerminalError(f"option {name}={raw!r} is not an integer") from None
            if value < minimum:
                raise SparkTerminalError(f"option {name} must be at least {minimum}, got {value}")
            return value

        return cls(
            starting_position=number("startingPosition", 1, 1) or 1,
            ending_position=number("endingPosition", None, 1),
            max_records_per_trigger=number("maxRecordsPerTrigger", None, 1),
            partition_size=number("partitionSize", 1_000_000, 1) or 1_000_000,
            max_partitions=number("maxPartitions", 64, 1) or 64,
        )


def offset(position: int) -> dict[str, int]:
    """The offset dict whose next position to read is ``position``."""
    return {OFFSET_KEY: int(position)}


def position_of(value: Mapping[str, Any]) -> int:
    """The next position to read of an offset dict (as written by ``offset``)."""
    try:
        return int(value[OFFSET_KEY])
    except (KeyError, TypeError, ValueError):
        raise SparkTerminalError(
            f"offset {dict(value)!r} is not a lakefold store offset; was the checkpoint "
            "written by another source? Use a new checkpoint location"
        ) from None


def split_range(start: int, end: int, options: ReadOptions) -> list[PositionRange]:
    """Contiguous ranges covering ``[start, end)``: about ``partition_size`` positions each,
    at most ``max_partitions`` of them; none for an empty range."""
    span = end - start
    if span <= 0:
        return []
    count = min(options.max_partitions, max(1, -(-span // options.partition_size)))
    step = -(-span // count)
    return [PositionRange(lo, min(lo + step, end)) for lo in range(start, end, step)]


def capped_end(start: int, head: int, limit_rows: int | None) -> int:
    """The end (exclusive) of the next micro-batch: the head + 1, at most ``limit_rows`` on.

    Position 0 holds no record (a projection's first batch starts there, so that an empty
    input still runs one batch): it does not count against the limit, or every build would
    end with a one-record batch."""
    end = max(start, head + 1)
    if limit_rows is not None:
        end = min(end, max(start, 1) + limit_rows)
    return end


def limit_rows(limit: Any) -> int | None:
    """The positions a Spark ``ReadLimit`` allows per micro-batch (None: all available)."""
    rows = getattr(limit, "max_rows", None) or getattr(limit, "maxRows", None)
    return int(rows) if rows else None
