"""The changelog store: durable, compacted changelog streams in the store database.

A package of its own, below capture, spark and the projections that share it (the capture
writes tables' changes, views write their output streams, everyone reads): it imports only
``lakefold.core``, ``lakefold.schemas`` and itself, so Spark's Python workers and every other
reader load it without the replication, decoding, snapshot and operations code. Moved out of
``lakefold.capture`` in round three; ``lakefold.capture.store`` is a deprecated alias.

Read side: ``ChangelogStore(store_dsn)`` (``streams``, ``captures``, ``head``, ``read``,
``read_events``, ``follow``, ``stream_schema``, ``compact``) and ``read_changelog_range`` for
Spark workers.
Durable readers (``commit_reader``, ``release_reader``, ``readers``) hold compaction back at
the position they have processed; ``compaction_state`` says what holds a stream, and
``keep_history`` keeps a stream's full history (no compaction) for history readers.
``frontier``, ``first_after`` and ``commit_at`` cut ranges of several streams at one source commit.
Positions start at 1; ``read``'s ``from_position`` is inclusive; ranges are ``[start, end)``.

Inside: the reads (``_changelog_store``), the writer the capture and snapshots append through
(``_changelog_writer``, ``_write_pipeline``), the store's tables (``_ddl``, ``_capture_state``),
compaction and the durable readers that hold it back (``_compaction``, ``_reader_registry``),
snapshot segments (``_snapshot_segments``), stream schemas and typed values
(``_stream_schema``, ``_text_values``, ``_arrow_columns``).

The names below are imported lazily (PEP 562), so ``lakefold.store.exceptions`` and this
package stay cheap to import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakefold.core.lazy import lazy_getattr

if TYPE_CHECKING:
    from lakefold.store._captures import CaptureInfo
    from lakefold.store._changelog_store import (
        META_SCHEMA,
        ChangelogStore,
        ChangelogStreamInfo,
        read_changelog_range,
    )
    from lakefold.store._commit_points import commit_at, first_after, frontier
    from lakefold.store._compaction import CompactionPolicy
    from lakefold.store._derived_streams import DERIVED_SLOT
    from lakefold.store._reader_registry import CompactionState, ReaderPosition
    from lakefold.store._stream_schema import ColumnSchema, StreamSchema
    from lakefold.store._text_values import Interval
    from lakefold.store.exceptions import (
        ReaderBehindCompactionError,
        StoreError,
        StoreUnavailableError,
        UnknownStreamError,
    )

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "META_SCHEMA": "lakefold.store._changelog_store",
    "ChangelogStore": "lakefold.store._changelog_store",
    "ChangelogStreamInfo": "lakefold.store._changelog_store",
    "read_changelog_range": "lakefold.store._changelog_store",
    "CaptureInfo": "lakefold.store._captures",
    "CompactionPolicy": "lakefold.store._compaction",
    "DERIVED_SLOT": "lakefold.store._derived_streams",
    "commit_at": "lakefold.store._commit_points",
    "first_after": "lakefold.store._commit_points",
    "frontier": "lakefold.store._commit_points",
    "CompactionState": "lakefold.store._reader_registry",
    "ReaderPosition": "lakefold.store._reader_registry",
    "ColumnSchema": "lakefold.store._stream_schema",
    "StreamSchema": "lakefold.store._stream_schema",
    "Interval": "lakefold.store._text_values",
    "ReaderBehindCompactionError": "lakefold.store.exceptions",
    "StoreError": "lakefold.store.exceptions",
    "StoreUnavailableError": "lakefold.store.exceptions",
    "UnknownStreamError": "lakefold.store.exceptions",
}

__all__ = [
    "DERIVED_SLOT",
    "META_SCHEMA",
    "CaptureInfo",
    "ChangelogStore",
    "ChangelogStreamInfo",
    "ColumnSchema",
    "CompactionPolicy",
    "CompactionState",
    "Interval",
    "ReaderBehindCompactionError",
    "ReaderPosition",
    "StoreError",
    "StoreUnavailableError",
    "StreamSchema",
    "UnknownStreamError",
    "commit_at",
    "first_after",
    "frontier",
    "read_changelog_range",
]

__getattr__ = lazy_getattr(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return __all__
