"""Schemas: pydantic models of change events and domain events, versions and upcasters."""

from lakefold.schemas.change import ChangeEvent, ChangeSource, Operation
from lakefold.schemas.events import (
    STREAM_DELETED_TYPE,
    EventEnvelope,
    EventMetadata,
    NewEvent,
    category_of,
    new_event_id,
)
from lakefold.schemas.exceptions import (
    InvalidEventDataError,
    SchemaError,
    UnknownEventTypeError,
    UpcastError,
)
from lakefold.schemas.registry import EventRegistry, EventType, StreamDeletedRecord

__all__: list[str] = ["ChangeEvent", "ChangeSource", "Operation"]

# Domain events: envelope, registry, upcasters (lakefold.eventstore's side of schemas).
__all__ += [
    "STREAM_DELETED_TYPE",
    "EventEnvelope",
    "EventMetadata",
    "EventRegistry",
    "EventType",
    "InvalidEventDataError",
    "NewEvent",
    "SchemaError",
    "StreamDeletedRecord",
    "UnknownEventTypeError",
    "UpcastError",
    "category_of",
    "new_event_id",
]

# Arrow and Spark schemas of event models and captured columns (lakefold.spark's side) are in
# the public module ``lakefold.schemas.arrow``.
