"""Errors of the schemas package: unknown event types, invalid payloads, failed upcasts."""

from __future__ import annotations

from lakefold.core.exceptions import LakefoldError, TerminalError


class SchemaError(LakefoldError):
    """Base of every schema error: ``except SchemaError`` catches them all."""


class SchemaTerminalError(SchemaError, TerminalError):
    """Data or a registration does not fit the registered models; fix the model or the data."""


class SchemaValueError(SchemaTerminalError, ValueError):
    """A registration or stored code is malformed (a bad event type name, version or
    operation code); also a ``ValueError`` for callers that catch that."""


class SchemaTypeError(SchemaTerminalError, TypeError):
    """A registration got an object of the wrong kind (not a pydantic model, an upcaster that
    is not callable); also a ``TypeError`` for callers that catch that."""


class UnknownEventTypeError(SchemaTerminalError):
    """The event type (or its stored version) is not registered; register the model or deploy
    the code that defines it."""


class InvalidEventDataError(SchemaTerminalError, ValueError):
    """An event's payload does not validate against its registered model; nothing was written."""


class UpcastError(SchemaTerminalError):
    """A stored event could not be brought to its current version; fix or add the upcaster."""
