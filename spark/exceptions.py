"""Errors of the Spark layer: sources, the Delta sink and queries."""

from __future__ import annotations

from lakefold.exceptions import TerminalError, TransientError


class SparkLayerError(TerminalError):
    """A Spark source, sink or query failed in a way that needs a person."""


class DeltaCommitConflict(TransientError):
    """Another writer committed to the Delta table first; retry the batch."""
