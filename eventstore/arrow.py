"""The event log as Arrow, for the readers that move events in bulk (the Spark source, the
projections' range reads): the record batch schema, the payload fields of sealed segments, and
range reads through ADBC. Applications read events with ``EventStore``; this module is for code
that reads the log by position range."""

from __future__ import annotations

from lakefold.eventstore._arrow import (
    EVENTS_ARROW_SCHEMA,
    events_range_select,
    events_schema,
    head_position,
    read_events_range,
)
from lakefold.eventstore._segments import PAYLOAD_FIELDS

__all__ = [
    "EVENTS_ARROW_SCHEMA",
    "PAYLOAD_FIELDS",
    "events_range_select",
    "events_schema",
    "head_position",
    "read_events_range",
]
