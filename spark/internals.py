"""What lakefold's other packages build on in ``lakefold.spark``, beyond its user API: each name
here is imported by another package, which may import no private module of this one (the layer
test counts such imports: none). Not for users: no stability promise. Loaded lazily, like the
package."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakefold.core.lazy import by_module, lazy_getattr

if TYPE_CHECKING:
    from lakefold.spark import _source_reads
    from lakefold.spark._catalog import is_delta_table as is_delta_table

    source_reads = _source_reads

    from lakefold.spark._delta_commit import (
        batch_properties as batch_properties,
        is_committed as is_committed,
        keys_match as keys_match,
        quote_identifier as quote_identifier,
    )
    from lakefold.spark._delta_target import normalize_table_uri as normalize_table_uri
    from lakefold.spark._event_payloads import (
        PayloadDecoder as PayloadDecoder,
    )
    from lakefold.spark._query import (
        no_duplicate_error_logs as no_duplicate_error_logs,
    )
    from lakefold.spark._s3a import checkpoint_root as checkpoint_root
    from lakefold.spark._source_columns import (
        EVENT_META_SOURCE_COLUMNS as EVENT_META_SOURCE_COLUMNS,
    )
    from lakefold.spark._source_cuts import (
        CutGroup as CutGroup,
    )
    from lakefold.spark._source_delta import (
        check_delta_table as check_delta_table,
        delta_version_at as delta_version_at,
    )
    from lakefold.spark._source_inputs import (
        ChangelogSource as ChangelogSource,
        DeltaSource as DeltaSource,
        EventSource as EventSource,
        Source as Source,
    )
    from lakefold.spark._source_live import (
        LIVE_READ_MAX as LIVE_READ_MAX,
        live_frame as live_frame,
    )
    from lakefold.spark._source_records import (
        TruncateOptions as TruncateOptions,
        range_frame as range_frame,
        source_frame as source_frame,
        spark_schema as spark_schema,
    )
    from lakefold.spark._source_truncates import (
        FAN_KEY_COLUMN as FAN_KEY_COLUMN,
        TRUNCATE as TRUNCATE,
        TRUNCATED_AT_COLUMN as TRUNCATED_AT_COLUMN,
        FoldKeys as FoldKeys,
        Mode as Mode,
        Truncate as Truncate,
    )

_EXPORTS: dict[str, tuple[str, ...]] = {
    "lakefold.spark._catalog": ("is_delta_table",),
    "lakefold.spark._delta_commit": ("batch_properties", "is_committed", "keys_match",
                                     "quote_identifier"),
    "lakefold.spark._delta_target": ("normalize_table_uri",),
    "lakefold.spark._event_payloads": ("PayloadDecoder",),
    "lakefold.spark._query": ("no_duplicate_error_logs",),
    "lakefold.spark._s3a": ("checkpoint_root",),
    "lakefold.spark._source_columns": ("EVENT_META_SOURCE_COLUMNS",),
    "lakefold.spark._source_cuts": ("CutGroup",),
    "lakefold.spark._source_delta": ("check_delta_table", "delta_version_at"),
    "lakefold.spark._source_inputs": ("ChangelogSource", "DeltaSource", "EventSource",
                                       "Source"),
    "lakefold.spark._source_live": ("LIVE_READ_MAX", "live_frame"),
    "lakefold.spark._source_records": (
        "TruncateOptions", "range_frame", "source_frame", "spark_schema",
    ),
    "lakefold.spark._source_truncates": (
        "FAN_KEY_COLUMN", "FoldKeys", "Mode", "TRUNCATE", "TRUNCATED_AT_COLUMN", "Truncate",
    ),
}

#: Modules used whole (``state.install(...)``), under a public name.
_MODULES: dict[str, str] = {
    "source_reads": "lakefold.spark._source_reads",
}

__getattr__ = lazy_getattr("lakefold.spark.internals", by_module(_EXPORTS), modules=_MODULES)
