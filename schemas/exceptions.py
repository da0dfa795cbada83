"""Errors of the schemas package: unknown event types, invalid payloads, failed upcasts."""

from __future__ import annotations

from lakefold.core.exceptions import TerminalError


class SchemaError(TerminalError):
    """Base of the schema errors: data does not fit the registered models."""


class UnknownEventType(SchemaError):
    """The event type (or its stored version) is not registered; register the model or deploy
    the code that defines it."""


class InvalidEventData(SchemaError, ValueError):
    """An event's payload does not validate against its registered model; nothing was written."""


class UpcastError(SchemaError):
    """A stored event could not be brought to its current version; fix or add the upcaster."""
