"""What a capture reads and where it writes: ``CaptureConfig``, and ``TableRef`` for the tables
it lists."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Final

from lakefold.capture._options import HeartbeatPolicy, SnapshotPolicy
from lakefold.capture.exceptions import CaptureConfigurationError, SourceConfigurationError
from lakefold.store.internals import CompactionPolicy

_SLOT_NAME: Final = re.compile(r"^[a-z0-9_]{1,63}$")


#: The slot name of captures made before slot names were per database (still kept by a store
#: that records one; see ``slot_name_for``).
LEGACY_SLOT: Final = "lakefold"


def slot_name_for(database: str) -> str:
    """The default slot name of a capture of ``database``: ``lakefold_<database>``, so that
    captures of two databases of one server do not collide (slot names are per server). A
    name that is not all lower-case letters, digits and ``_``, or too long, is folded into
    those characters and gets 8 hex digits of its SHA-1, so two names never fold together."""
    folded = "".join(c if c in "abcdefghijklmnopqrstuvwxyz0123456789_" else "_"
                     for c in database.lower())
    name = f"{LEGACY_SLOT}_{folded}"
    if folded == database and len(name) <= 63:
        return name
    digest = hashlib.sha1(database.encode("utf-8"), usedforsecurity=False).hexdigest()[:8]
    return f"{name[:54]}_{digest}"


@dataclass(frozen=True, slots=True)
class TableRef:
    """A source table, ``schema.table``."""

    schema: str
    table: str

    @classmethod
    def parse(cls, text: str) -> TableRef:
        """``"s.t"`` or ``"t"`` (schema ``public``)."""
        schema, sep, table = text.strip().rpartition(".")
        if not table:
            raise SourceConfigurationError(f"table name {text!r} is empty; use schema.table")
        return cls(schema if sep else "public", table)

    def __str__(self) -> str:
        return f"{self.schema}.{self.table}"


@dataclass(frozen=True, slots=True)
class CaptureConfig:
    """A capture of one source database into a changelog store.

    ``source_dsn``: the database to capture (the role needs REPLICATION).
    ``store_dsn``: where the ``lakefold`` schema lives; defaults to the source database.
    ``slot`` / ``publication``: the replication slot and publication lakefold creates and
    owns (slot names: lower-case letters, digits and ``_``).
    ``schema`` or ``tables``: capture every table of one schema (tables created later
    included), or the listed ``schema.table`` names. Exactly one of them. Only tables with a
    key PostgreSQL can use as replica identity are published (``_publishable``); a schema
    capture needs a superuser (``_publication_guard``).
    ``stream_prefix``: streams are named ``<prefix><schema>.<table>``. A prefix belongs to
    one source: the capture of a second source into the same store needs a prefix (and a
    slot) of its own, or its set-up refuses before creating anything (``_sources``).
    ``streaming``: protocol v2 with streaming of large in-progress transactions: the server
    sends them while they run instead of spilling them to disk on the source first; lakefold
    stages them in the store and moves them into the changelog at commit. Off by default:
    then a large transaction is written once, straight into the changelog, in resumable
    chunks (faster end to end, see BENCHMARKS.md), and the server spills it while decoding.
    ``keep_messages``: store logical decoding messages in ``lakefold.capture_messages``.
    ``compaction``: compact the streams in the background while capturing.
    ``max_retries``: give up after this many consecutive failed reconnects (None: never).
    ``snapshot``: the initial snapshot when the slot is created, and chunking of snapshots
    (``SnapshotPolicy(initial=False)`` captures only changes made after the slot exists).
    ``heartbeat``: heartbeats that keep the slot advancing while captured tables are idle.
    ``take_over``: when another capture runs on the slot (in this store), ask it to stop
    cleanly and take the slot over, instead of refusing to start; ``take_over_timeout``: how
    long to wait for it to stop before giving up (it is never forced).
    """

    source_dsn: str
    store_dsn: str | None = None
    slot: str = "lakefold"
    publication: str = "lakefold"
    schema: str | None = None
    tables: tuple[str, ...] = ()
    stream_prefix: str = ""
    streaming: bool = False
    keep_messages: bool = False
    batch_rows: int = 20_000
    batch_bytes: int = 8 << 20
    feedback_interval: timedelta = timedelta(seconds=10)
    max_backoff: timedelta = timedelta(seconds=10)
    max_retries: int | None = None
    compaction: CompactionPolicy | None = None
    snapshot: SnapshotPolicy = field(default_factory=SnapshotPolicy)
    heartbeat: HeartbeatPolicy | None = field(default_factory=HeartbeatPolicy)
    take_over: bool = False
    take_over_timeout: timedelta = timedelta(seconds=30)
    table_refs: tuple[TableRef, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        if not self.source_dsn:
            raise CaptureConfigurationError("source_dsn is empty; give the DSN of the database to "
                                     "capture (LAKEFOLD_DSN or --dsn)")
        if not _SLOT_NAME.match(self.slot):
            raise CaptureConfigurationError(
                f"slot name {self.slot!r} is invalid; use 1-63 lower-case letters, digits and "
                "underscores")
        if not self.publication or len(self.publication) > 63:
            raise CaptureConfigurationError(
                f"publication name {self.publication!r} must have 1-63 characters")
        if (self.schema is None) == (not self.tables):
            raise CaptureConfigurationError(
                "say what to capture: either a schema (all its tables) or a list of tables, "
                "not both and not neither")
        if isinstance(self.tables, str):
            raise CaptureConfigurationError("tables must be a sequence of 'schema.table' names")
        refs = tuple(TableRef.parse(t) for t in self.tables)
        if len(set(refs)) != len(refs):
            raise CaptureConfigurationError(f"tables lists a table twice: {', '.join(self.tables)}")
        object.__setattr__(self, "table_refs", refs)
        if self.batch_rows < 1 or self.batch_bytes < 1024:
            raise CaptureConfigurationError("batch_rows must be >= 1 and batch_bytes >= 1024")
        if self.take_over_timeout.total_seconds() <= 0:
            raise CaptureConfigurationError(
                f"take_over_timeout must be positive, not {self.take_over_timeout}; it is how "
                "long to wait for the running capture to hand the slot over")

    @property
    def resolved_store_dsn(self) -> str:
        """The store DSN (the source's when not set)."""
        return self.store_dsn or self.source_dsn

    @property
    def application_name(self) -> str:
        """The application name of the capture's replication connection."""
        return f"lakefold-capture:{self.slot}"
