"""The record metadata columns: one vocabulary for every record a lakefold source reads.

Every frame a projection reads (live runs, rebuilds, catch-up, targeted rebuilds, the status'
lag) starts with the same five columns, whatever the input:

=============  ======================  ===================================================
column         type                    meaning
=============  ======================  ===================================================
``_position``  long, not null          the record's position in its input (event store:
                                       the global position; changelog: the stream's)
``_ts``        timestamp (UTC)         when it happened: the event's ``recorded_at``, the
                                       change's source commit time (``_commit_ts``)
``_type``      string                  the event type; for a change ``insert`` (snapshot
                                       reads too), ``update``, ``delete`` or ``truncate``
``_stream``    string                  the event's stream id; for a change the table
                                       (``schema.table``)
``_deleted``   boolean                 true for a changelog delete and for the record of a
                                       deleted event stream (type ``$stream.deleted``)
=============  ======================  ===================================================

After them come the input's own columns, as its store keeps them: for events the event store's
columns (``position``, ``event_id``, ``stream_id``, ``stream_version``, ``category``, ``type``,
``schema_version``, ``data``, ``metadata``, ``correlation_id``, ``causation_id``,
``recorded_at``); for a changelog the capture's change columns (``_op``, ``_commit_lsn``,
``_ordinal``, ``_xid``, ``_commit_ts``, ``_schema_version``) and then one typed column per
column of the captured table. A fold's changelog frames add ``_fan_key`` and
``_truncated_at`` (see ``_source_truncates``).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

POSITION_COLUMN = "_position"
TIMESTAMP_COLUMN = "_ts"
TYPE_COLUMN = "_type"
STREAM_COLUMN = "_stream"
DELETED_COLUMN = "_deleted"

META_FIELDS = [
    pa.field(POSITION_COLUMN, pa.int64(), nullable=False),
    pa.field(TIMESTAMP_COLUMN, pa.timestamp("us", tz="UTC")),
    pa.field(TYPE_COLUMN, pa.string()),
    pa.field(STREAM_COLUMN, pa.string()),
    pa.field(DELETED_COLUMN, pa.bool_()),
]
#: Event columns every event read needs: the metadata columns are made from them.
EVENT_META_SOURCE_COLUMNS = ("position", "recorded_at", "type", "stream_id")
_STREAM_DELETED = "$stream.deleted"


def event_records(batch: pa.RecordBatch) -> pa.RecordBatch:
    """An event store batch with the metadata columns in front."""
    types = batch.column("type")
    deleted = pc.equal(types, _STREAM_DELETED)
    arrays = [batch.column("position"), batch.column("recorded_at"), types,
              batch.column("stream_id"), deleted]
    return pa.RecordBatch.from_arrays([*arrays, *batch.columns],
                                      schema=pa.schema([*META_FIELDS, *batch.schema]))


def changelog_records(batch: pa.RecordBatch, stream: str) -> pa.RecordBatch:
    """A changelog batch with the metadata columns in front: ``_type`` is insert (snapshot
    reads too), update, delete or truncate; ``_deleted`` is true for deletes."""
    op = batch.column("_op")
    kind = pc.if_else(pc.equal(op, "read"), "insert", op)
    meta = [batch.column(POSITION_COLUMN),
            pc.cast(batch.column("_commit_ts"), pa.timestamp("us", tz="UTC")),
            kind.cast(pa.string()),
            pa.array([stream] * batch.num_rows, pa.string()),
            pc.equal(op, "delete")]
    skip = {f.name for f in META_FIELDS}
    rest = [(f, batch.column(i)) for i, f in enumerate(batch.schema) if f.name not in skip]
    return pa.RecordBatch.from_arrays(
        [*meta, *(c for _, c in rest)],
        schema=pa.schema([*META_FIELDS, *(f for f, _ in rest)]))
