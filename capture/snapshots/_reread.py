"""Rows read again in-band: the rows queued in ``lakefold.capture_rereads``.

An update whose unchanged TOASTed value has no earlier record of its key to be filled from is
left out of the stream and its row queued here (see ``_toast_fill``). The capture's side thread
reads each queued row with the incremental snapshot's procedure (``_incremental_snapshot``): the
table is locked in ROW SHARE mode, the row read FOR SHARE (waiting for its writers) and written into
the WAL as an in-band chunk, so the capture turns it into a ``read`` record at a point of the
stream where it is consistent. A row that no longer exists gets no read (its delete record
tells readers). A request is removed once its chunk is in the WAL; reading a row twice (a
crash in between) is harmless, a read restates the row.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

import psycopg

from lakefold.capture.exceptions import SourceConfigurationError
from lakefold.capture.snapshots._incremental_snapshot import lock_table, send_row
from lakefold.capture.snapshots._initial_snapshot import source_connection
from lakefold.capture.snapshots._table_shape import find_table
from lakefold.store.internals import StreamSchema, split_key

if TYPE_CHECKING:
    from lakefold.capture._config import CaptureConfig

log = logging.getLogger(__name__)

_BATCH: Final = 500

_PENDING: Final = """
SELECT r.stream_id, r.key, s.source_schema, s.source_table, v.columns
FROM lakefold.capture_rereads r
JOIN lakefold.changelog_streams s USING (stream_id)
JOIN lakefold.changelog_schemas v ON v.stream_id = r.stream_id AND v.version = r.schema_version
WHERE r.slot_name = %s ORDER BY r.requested_at LIMIT %s
"""


def reread_queued(config: CaptureConfig) -> None:
    """Read every row the capture has queued (``reread_rows`` over new connections); a
    capture does this when it starts, its side thread while it runs."""
    with psycopg.connect(config.resolved_store_dsn, autocommit=True,
                         connect_timeout=10) as store, \
            source_connection(config.source_dsn, autocommit=True) as source:
        while reread_rows(source, store, config) == _BATCH:
            pass


def reread_rows(source: psycopg.Connection[Any], store: psycopg.Connection[Any],
                config: CaptureConfig) -> int:
    """Read the capture's queued rows again, in-band; returns how many requests were done.
    ``source`` and ``store`` are autocommit connections."""
    rows = store.execute(_PENDING, (config.slot, _BATCH)).fetchall()
    timeout = config.snapshot.lock_timeout.total_seconds()
    for stream_id, key, schema, table, columns in rows:
        names = [c.name for c in StreamSchema.columns_from_json(columns) if c.key]
        texts = [None if v is None else bytes(v).decode() for v in split_key(bytes(key))]
        try:
            relid = find_table(source, f"{schema}.{table}")
        except SourceConfigurationError as e:  # the table is gone: nothing to read
            log.warning("cannot read a row of %s.%s again: %s", schema, table, e)
            relid = None
        if relid is not None:
            # Errors here (a lock timeout, a missing privilege) keep the request: the side
            # thread logs them and tries again.
            with source.transaction():
                shape = lock_table(source, relid, timeout)
                by_name = dict(zip(names, texts, strict=True))
                if set(by_name) != set(shape.order_key) or None in texts:
                    log.warning("cannot read a row of %s.%s again: its key (%s) is no longer "
                                "the table's key (%s)", schema, table, ", ".join(names),
                                ", ".join(shape.order_key))
                else:
                    send_row(source, shape, config, 0,
                             tuple(str(by_name[k]) for k in shape.order_key))
        store.execute("DELETE FROM lakefold.capture_rereads WHERE slot_name = %s "
                      "AND stream_id = %s AND key = %s", (config.slot, stream_id, key))
    return len(rows)
