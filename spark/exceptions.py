"""Errors of the Spark layer: sources, the Delta sink and queries."""

from __future__ import annotations

from lakefold.core.exceptions import LakefoldError, TerminalError, TransientError


class SparkLayerError(LakefoldError):
    """Base of every Spark-layer error, transient and terminal: ``except SparkLayerError``
    catches them all; ``error.transient`` tells which to retry."""


class SparkTerminalError(SparkLayerError, TerminalError):
    """A Spark source, sink or query failed in a way that needs a person."""


class DeltaCommitConflictError(SparkLayerError, TransientError):
    """Another writer committed to the Delta table first; retry the batch."""


class SchemaMergeError(SparkTerminalError):
    """A batch's schema cannot be merged into the Delta table's; nothing was committed."""


class NotADeltaTableError(SparkTerminalError):
    """A path that should hold a Delta table does not."""


class DeltaInputError(SparkTerminalError):
    """A Delta table read as a projection input (``delta_changes``) cannot be read as asked: a
    version that removes rows without the change data feed, a missing key column, a schema
    that changed incompatibly, a version the log no longer has."""


class DeltaInputColumnError(DeltaInputError):
    """A Delta input's table lacks a column the input names (its ``key``)."""


class UnknownTableError(SparkTerminalError):
    """A query names a table the catalog does not know."""


class QueryError(SparkTerminalError):
    """A query could not be parsed or analysed; the message is the engine's, without a JVM
    stack trace."""


class SourceUnavailableError(SparkLayerError, TransientError):
    """A store a source reads from cannot be reached right now; Spark retries the task."""
