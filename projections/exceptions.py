"""Errors of the projections package: definitions, validation, targets, the runner and the catalog.

Every error is a ``LakefoldError``; transient ones (a lost connection, a commit conflict) are
retried with backoff by the runner, terminal ones stop the projection and are shown to a person.
"""

from __future__ import annotations

from lakefold.core.exceptions import LakefoldError, TerminalError, TransientError


class ProjectionError(LakefoldError):
    """Base of every projections error, transient and terminal: ``except ProjectionError``
    catches them all; ``error.transient`` tells which to retry."""


class ProjectionTerminalError(ProjectionError, TerminalError):
    """A projection cannot run as defined or as asked; the message says what to change."""


class ProjectionValueError(ProjectionTerminalError, ValueError):
    """A projection option or value is malformed; also a ``ValueError`` for callers that catch
    that."""


class ProjectionTypeError(ProjectionTerminalError, TypeError):
    """A value of a type a projection cannot store or encode; also a ``TypeError`` (what
    ``json.dumps``' ``default`` hook raises) for callers that catch that."""


class ProjectionTimeoutError(ProjectionError, TransientError, TimeoutError):
    """The projections did not catch up within the time asked; also a ``TimeoutError``."""


class ProjectionDefinitionError(ProjectionTerminalError):
    """A projection definition is malformed (bad name, no sources, a handler without a type...)."""


class UnknownSourceError(ProjectionDefinitionError):
    """A projection reads a changelog stream, event category or event type that does not exist."""


class MissingKeyError(ProjectionDefinitionError):
    """A key column or field that the projection or its target needs is not in the data."""


class IncompatibleTargetError(ProjectionDefinitionError):
    """The projection's output cannot be written to its target (mode, columns or types)."""


class StatefulChangelogError(ProjectionDefinitionError):
    """A transform keeps state across records (aggregation, join, deduplication...) over a
    changelog: Spark streaming has no retractions, so the view would silently drift."""


class NotMaintainableError(ProjectionDefinitionError):
    """A view's query cannot be maintained by recomputing the partitions a change touches
    (a LIMIT, a non-deterministic function, a join without equal keys...); the message names
    the part of the query and why."""


class ProjectionNotFoundError(ProjectionTerminalError):
    """A command names a projection that is not registered or not in the catalog."""


class ProjectionStateError(ProjectionTerminalError):
    """The catalog refuses a change of state (e.g. a rebuild while one is already running)."""


class BehindCompactionError(ProjectionStateError):
    """A generation would read a changelog stream after records that compaction removed and
    it needs (missed deletes; for a history target, any version): it must not run on as if
    nothing happened. The message names the stream, the positions, the compaction and the fix
    (``lakefold rebuild NAME``, or why a rebuild cannot help)."""


class TargetError(ProjectionTerminalError):
    """A target (Delta, Redis, search) refused a write in a way that retrying will not fix."""


class TargetUnavailableError(ProjectionError, TransientError):
    """A target could not be reached or a commit conflicted; retry the batch with backoff."""


class CatalogUnavailableError(ProjectionError, TransientError):
    """The catalog database could not be reached; retry with backoff."""


class RecordFailedError(ProjectionTerminalError):
    """User code failed on one record after every retry; the record goes to the dead letters
    or, by the projection's policy, stops it."""
