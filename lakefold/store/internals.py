"""What lakefold's other packages build on in ``lakefold.store``, beyond its user API: each name
here is imported by another package, which may import no private module of this one (the layer
test counts such imports: none). Not for users: no stability promise. Loaded lazily, like the
package."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakefold.core.lazy import by_module, lazy_getattr

if TYPE_CHECKING:
    from lakefold.store import _capture_state, _ddl, _reader_registry, _snapshot_segments

    capture_state = _capture_state
    ddl = _ddl
    reader_registry = _reader_registry
    snapshot_segments = _snapshot_segments

    from lakefold.store._arrow_columns import (
        arrow_type as arrow_type,
        typed_array as typed_array,
    )
    from lakefold.store._capture_state import (
        event_commit_lsns as event_commit_lsns,
        slot_flushed as slot_flushed,
    )
    from lakefold.store._changelog_store import (
        ChangelogStore as ChangelogStore,
        StreamMeta as StreamMeta,
        copy_records as copy_records,
        data_columns as data_columns,
        empty_raw as empty_raw,
        row_schema as row_schema,
        stream_meta as stream_meta,
        typed as typed,
    )
    from lakefold.store._changelog_writer import (
        NOTIFY_CHANNEL as NOTIFY_CHANNEL,
        NULL_FIELD as NULL_FIELD,
        Batch as Batch,
        CapturedMessage as CapturedMessage,
        ChangelogWriter as ChangelogWriter,
        Checkpoint as Checkpoint,
        SlotState as SlotState,
        StreamedCommit as StreamedCommit,
        encode_key as encode_key,
        split_key as split_key,
    )
    from lakefold.store._commit_points import (
        commit_at as commit_at,
        first_after as first_after,
        frontier as frontier,
    )
    from lakefold.store._compaction import (
        BackgroundCompactor as BackgroundCompactor,
        CompactionPolicy as CompactionPolicy,
    )
    from lakefold.store._derived_streams import (
        DERIVED_SLOT as DERIVED_SLOT,
        DerivedStream as DerivedStream,
        column_for as column_for,
        text_array as text_array,
    )
    from lakefold.store._stream_schema import (
        ColumnSchema as ColumnSchema,
        StreamSchema as StreamSchema,
        TypeInfo as TypeInfo,
        builtin_type as builtin_type,
        type_from_catalog as type_from_catalog,
    )
    from lakefold.store._write_pipeline import (
        StorePipeline as StorePipeline,
        translate_store_error as translate_store_error,
    )

_EXPORTS: dict[str, tuple[str, ...]] = {
    "lakefold.store._arrow_columns": ("arrow_type", "typed_array"),
    "lakefold.store._capture_state": ("event_commit_lsns", "slot_flushed"),
    "lakefold.store._changelog_store": (
        "ChangelogStore", "StreamMeta", "copy_records", "data_columns", "empty_raw",
        "row_schema", "stream_meta", "typed",
    ),
    "lakefold.store._changelog_writer": (
        "Batch", "CapturedMessage", "ChangelogWriter", "Checkpoint", "NOTIFY_CHANNEL",
        "NULL_FIELD", "SlotState", "StreamedCommit", "encode_key", "split_key",
    ),
    "lakefold.store._commit_points": ("commit_at", "first_after", "frontier"),
    "lakefold.store._compaction": ("BackgroundCompactor", "CompactionPolicy"),
    "lakefold.store._derived_streams": (
        "DERIVED_SLOT", "DerivedStream", "column_for", "text_array",
    ),
    "lakefold.store._stream_schema": (
        "ColumnSchema", "StreamSchema", "TypeInfo", "builtin_type", "type_from_catalog",
    ),
    "lakefold.store._write_pipeline": ("StorePipeline", "translate_store_error"),
}

#: Modules used whole (``state.install(...)``), under a public name.
_MODULES: dict[str, str] = {
    "capture_state": "lakefold.store._capture_state",
    "ddl": "lakefold.store._ddl",
    "reader_registry": "lakefold.store._reader_registry",
    "snapshot_segments": "lakefold.store._snapshot_segments",
}

__getattr__ = lazy_getattr("lakefold.store.internals", by_module(_EXPORTS), modules=_MODULES)
