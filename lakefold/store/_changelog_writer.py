"""Writing to the changelog store: batches of binary-COPY rows, each committed atomically with
the stream heads and the slot's de-duplication checkpoint.

A ``Batch`` is built by the decoder (``_decoder``) and written by ``ChangelogWriter.write_batch``
in ONE store transaction, in this order:

1. rows of streamed in-progress transactions into ``changelog_staging`` (COPY);
2. records into ``changelog`` (COPY; their positions were assigned by the decoder);
3. streamed transactions that committed: staged rows moved into ``changelog`` with positions
   and ordinals (one INSERT ... SELECT each), then unstaged; aborted ones unstaged;
4. stream heads moved to the end of the last complete source transaction (readers only see
   records up to the head, so a reader never sees half a source transaction);
5. the checkpoint ``(commit_lsn, ordinal, complete, flush_lsn)`` of the slot;
6. ``NOTIFY lakefold_changelog`` with each stream whose head moved.

Only after that commit does the capture confirm ``flush_lsn`` to the source's slot. A crash at
any instant therefore leaves the store at a batch boundary, and the restarted capture skips
what the checkpoint says is stored: nothing lost, nothing twice.

Snapshot writers (issue "snapshots") append through the same class: they build Batches of
``r`` records for a stream in the same way.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg
from psycopg import sql

from lakefold.store import _ddl
from lakefold.store._stream_schema import StreamSchema
from lakefold.store.exceptions import OwnershipError, OwnershipLostError, StoreError

NOTIFY_CHANNEL: Final = "lakefold_changelog"

COPY_HEADER: Final = b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8
COPY_TRAILER: Final = b"\xff\xff"
NULL_FIELD: Final = b"\xff\xff\xff\xff"
TEXT_OID: Final = 25

CHANGELOG_COPY: Final = (
    "COPY lakefold.changelog (position, ordinal, commit_lsn, xid, commit_ts, stream_id, "
    "schema_version, op, key, before, after) FROM STDIN (FORMAT BINARY)"
)
_STAGING_COPY: Final = (
    "COPY {} (xid, subxid, seq, stream_seq, stream_id, schema_version, op, key, before, after) "
    "FROM STDIN (FORMAT BINARY)"
)

_ARRAY_HEADER = struct.Struct(">iiiiii")  # field length, ndim, flags, element oid, dim, lbound


def text_array_field(parts: list[bytes]) -> bytes:
    """A binary-COPY field holding a one-dimensional ``text[]``; ``parts`` are the elements
    already encoded as ``int32 length + bytes`` (or ``NULL_FIELD``)."""
    body = b"".join(parts)
    return _ARRAY_HEADER.pack(20 + len(body), 1, 0, TEXT_OID, len(parts), 1) + body


def decode_text_array_field(field_bytes: bytes) -> list[bytes | None]:
    """The inverse of ``text_array_field`` without the leading field length (for tests)."""
    ndim, _flags, _oid = struct.unpack_from(">iii", field_bytes, 0)
    if ndim == 0:
        return []
    (count,) = struct.unpack_from(">i", field_bytes, 12)
    return split_key(field_bytes[20:], count)


def encode_key(values: Sequence[str | None]) -> bytes:
    """The ``key`` column of a record: each key column's text value, in column order, as a
    4-byte big-endian byte length followed by its UTF-8 bytes (length -1 for a NULL, as
    pgoutput's tuples become keys in ``_decoder``)."""
    out = bytearray()
    for value in values:
        if value is None:
            out += NULL_FIELD
            continue
        raw = value.encode()
        out += struct.pack(">i", len(raw)) + raw
    return bytes(out)


def split_key(key: bytes, count: int | None = None) -> list[bytes | None]:
    """The inverse of ``encode_key`` (values as bytes; None for a NULL element)."""
    out: list[bytes | None] = []
    offset = 0
    while offset < len(key) and (count is None or len(out) < count):
        (length,) = struct.unpack_from(">i", key, offset)
        offset += 4
        if length < 0:
            out.append(None)
        else:
            out.append(key[offset:offset + length])
            offset += length
    return out


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What a slot has durably written: the last record ``(commit_lsn, ordinal)``, whether
    that source transaction is complete, and the LSN that may be confirmed to the slot."""

    commit_lsn: int = 0
    ordinal: int = 0
    complete: bool = True
    flush_lsn: int = 0

    def covers(self, commit_lsn: int, ordinal: int) -> bool:
        """True when the record ``(commit_lsn, ordinal)`` is already stored."""
        if commit_lsn != self.commit_lsn:
            return commit_lsn < self.commit_lsn
        return self.complete or ordinal <= self.ordinal


@dataclass(frozen=True, slots=True)
class StreamedCommit:
    """A streamed (protocol v2) transaction that committed: move its staged rows.

    ``bases`` gives, per stream, the position of the first moved row; rows are numbered in
    staging order. ``skip_ordinal`` drops rows already stored by an earlier run.
    """

    xid: int
    commit_lsn: int
    commit_ts: int
    aborted_subxids: tuple[int, ...]
    skip_ordinal: int
    bases: tuple[tuple[int, int], ...]

    @property
    def exact(self) -> bool:
        """Staged sequence numbers are the final ordinals (nothing aborted or skipped)."""
        return not self.aborted_subxids and self.skip_ordinal == 0


@dataclass(frozen=True, slots=True)
class CapturedMessage:
    """A logical decoding message (``pg_logical_emit_message``)."""

    lsn: int
    commit_lsn: int | None
    ordinal: int
    transactional: bool
    prefix: str
    content: bytes


@dataclass
class Batch:
    """Everything one store transaction writes (see the module docstring for the order)."""

    rows: list[bytes] = field(default_factory=list)
    staging: list[bytes] = field(default_factory=list)
    commits: list[StreamedCommit] = field(default_factory=list)
    unstage: list[tuple[int, int | None]] = field(default_factory=list)  # (xid, subxid)
    heads: dict[int, int] = field(default_factory=dict)
    head_ts: dict[int, int] = field(default_factory=dict)
    messages: list[CapturedMessage] = field(default_factory=list)
    drop_invisible: list[int] = field(default_factory=list)
    truncate_staging: bool = False
    # callables run with the cursor after the records are written (TOAST fills, heartbeats)
    actions: list[Any] = field(default_factory=list)
    checkpoint: Checkpoint | None = None
    records: int = 0
    size: int = 0

    @property
    def empty(self) -> bool:
        return not (self.rows or self.staging or self.commits or self.unstage or self.heads
                    or self.messages or self.drop_invisible or self.truncate_staging
                    or self.actions or self.checkpoint)


@dataclass(frozen=True, slots=True)
class StreamResume:
    """A stream as the capture resumes it: its head and the next position to assign."""

    stream_id: int
    name: str
    head: int
    next_position: int
    schema: StreamSchema | None


@dataclass(frozen=True, slots=True)
class SlotState:
    """What the store knows about a slot when a capture session starts."""

    checkpoint: Checkpoint
    streams: tuple[StreamResume, ...]


class ChangelogWriter:
    """Writes to the store over one connection (not thread-safe: one per thread).

    ``slot`` names the capture (its replication slot); streams belong to exactly one slot.
    ``owner``: the ownership token of the capture writing (``_slot_ownership``); then every batch
    first checks that the slot's owner row still carries it, and a batch of a capture that
    lost its slot raises OwnershipLostError and writes nothing.
    """

    def __init__(self, conn: psycopg.Connection[Any], slot: str, *,
                 owner: str | None = None) -> None:
        self._conn = conn
        self._slot = slot
        self._owner = owner
        self._staging = _ddl.staging_table(slot)
        self._staging_copy = sql.SQL(_STAGING_COPY).format(self._staging)

    @property
    def connection(self) -> psycopg.Connection[Any]:
        return self._conn

    # -- slot registration and state -------------------------------------------------------

    def slot_record(self) -> dict[str, Any] | None:
        """The store's row for this slot, or None when the store does not know it."""
        cur = self._conn.execute(
            # source: read through to_jsonb, so that a store not yet migrated to it answers
            "SELECT publication, source_system_id, source_database, commit_lsn, ordinal, "
            "complete, flush_lsn, coalesce(to_jsonb(c) ->> 'source', '') "
            "FROM lakefold.capture_slots c WHERE slot_name = %s",
            (self._slot,),
        )
        row = cur.fetchone()
        if row is None:
            return None
        names = ("publication", "source_system_id", "source_database", "commit_lsn",
                 "ordinal", "complete", "flush_lsn", "source")
        return dict(zip(names, row, strict=True))

    def register_slot(self, *, publication: str, system_id: str, database: str,
                      consistent_point: int, source: str = "", stream_prefix: str = "") -> None:
        """Record that this capture owns the slot (called right after creating it), with its
        source as shown (``host:port/database``) and its stream prefix."""
        with self._conn.transaction():
            self._conn.execute(
                "INSERT INTO lakefold.capture_slots (slot_name, publication, source_system_id, "
                "source_database, flush_lsn, source, stream_prefix) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (self._slot, publication, system_id, database, consistent_point, source,
                 stream_prefix),
            )
            _ddl.create_staging(self._conn, self._slot)

    def forget_slot(self) -> None:
        """Remove the slot's row (after the slot itself was dropped). Streams stay."""
        with self._conn.transaction():
            self._conn.execute("DELETE FROM lakefold.capture_slots WHERE slot_name = %s",
                               (self._slot,))
            _ddl.drop_staging(self._conn, self._slot)

    def load_state(self) -> SlotState:
        """The checkpoint and the slot's streams, and discard staged rows of in-progress
        transactions (the server sends those again from their start)."""
        with self._conn.transaction():
            _ddl.create_staging(self._conn, self._slot)
            self._conn.execute(sql.SQL("TRUNCATE {}").format(self._staging))
            row = self._conn.execute(
                "SELECT commit_lsn, ordinal, complete, flush_lsn FROM lakefold.capture_slots "
                "WHERE slot_name = %s", (self._slot,),
            ).fetchone()
            if row is None:
                raise StoreError(
                    f"the store has no record of slot {self._slot!r}; run the capture's set-up "
                    "first (Capture.run creates the slot and registers it)"
                )
            checkpoint = Checkpoint(int(row[0]), int(row[1]), bool(row[2]), int(row[3]))
            streams = []
            for stream_id, name, head in self._conn.execute(
                "SELECT stream_id, name, head FROM lakefold.changelog_streams "
                "WHERE slot_name = %s ORDER BY stream_id", (self._slot,),
            ).fetchall():
                last = self._conn.execute("SELECT lakefold.changelog_top(%s)",
                                          (stream_id,)).fetchone()
                top = max(int(head), int(last[0]) if last else 0)
                streams.append(StreamResume(stream_id, name, int(head), top + 1,
                                           self.latest_schema(stream_id, name)))
        return SlotState(checkpoint, tuple(streams))

    # -- streams and schema versions -------------------------------------------------------

    def ensure_stream(self, name: str, *, database: str, schema: str, table: str) -> int:
        """The id of stream ``name``, created for this slot if new.

        Raises OwnershipError when another slot writes that stream.
        """
        with self._conn.transaction():
            self._conn.execute(
                "INSERT INTO lakefold.changelog_streams (name, slot_name, source_database, "
                "source_schema, source_table) VALUES (%s, %s, %s, %s, %s) "
                "ON CONFLICT (name) DO NOTHING",
                (name, self._slot, database, schema, table),
            )
            row = self._conn.execute(
                "SELECT stream_id, slot_name FROM lakefold.changelog_streams WHERE name = %s",
                (name,),
            ).fetchone()
        if row is None:
            raise StoreError(f"stream {name!r} could not be created")
        if row[1] != self._slot:
            raise OwnershipError(
                f"stream {name!r} is written by the capture of slot {row[1]!r}; one table can "
                "only be captured into a store once. Use another store, or a stream prefix "
                "of this capture's own (--stream-prefix, CaptureConfig.stream_prefix)"
            )
        return int(row[0])

    def latest_schema(self, stream_id: int, name: str) -> StreamSchema | None:
        row = self._conn.execute(
            "SELECT s.version, s.relation_oid, s.replica_identity, s.source_schema, "
            "s.source_table, s.columns, t.source_database, s.keyless "
            "FROM lakefold.changelog_schemas s "
            "JOIN lakefold.changelog_streams t USING (stream_id) WHERE s.stream_id = %s "
            "ORDER BY s.version DESC LIMIT 1", (stream_id,),
        ).fetchone()
        if row is None:
            return None
        return StreamSchema(
            stream=name, version=int(row[0]), database=row[6], schema=row[3], table=row[4],
            relation_oid=int(row[1]), replica_identity=row[2],
            columns=StreamSchema.columns_from_json(row[5]), keyless=bool(row[7]),
        )

    def register_schema(self, stream_id: int, schema: StreamSchema, *, lsn: int) -> int:
        """Store ``schema`` as the stream's next version unless the latest has the same shape;
        returns the version records should carry."""
        with self._conn.transaction():
            self._conn.execute(
                "SELECT 1 FROM lakefold.changelog_streams WHERE stream_id = %s FOR UPDATE",
                (stream_id,),
            )
            latest = self.latest_schema(stream_id, schema.stream)
            if latest is not None and latest.same_shape(schema):
                return latest.version
            version = 1 if latest is None else latest.version + 1
            self._conn.execute(
                "INSERT INTO lakefold.changelog_schemas (stream_id, version, relation_oid, "
                "replica_identity, source_schema, source_table, columns, created_lsn, "
                "keyless) VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s)",
                (stream_id, version, schema.relation_oid, schema.replica_identity,
                 schema.schema, schema.table, schema.columns_json(), lsn, schema.keyless),
            )
            self._conn.execute(
                "UPDATE lakefold.changelog_streams SET schema_version = %s WHERE stream_id = %s",
                (version, stream_id),
            )
        return version

    # -- batches ---------------------------------------------------------------------------

    def write_batch(self, batch: Batch) -> None:
        """Write ``batch`` in one transaction (see the module docstring). On any error the
        transaction rolls back and nothing of the batch is visible."""
        conn = self._conn
        with conn.transaction(), conn.cursor() as cur:
            if self._owner is not None:
                self._check_owner(cur)
            if batch.drop_invisible:
                cur.execute("SELECT lakefold.changelog_drop_beyond_head(%s)",
                            (batch.drop_invisible,))
            if batch.staging:
                self._copy(cur, self._staging_copy, batch.staging)
            if batch.rows:
                self._copy(cur, CHANGELOG_COPY, batch.rows)
            for commit in batch.commits:
                self._move_streamed(cur, commit)
            if batch.truncate_staging:
                cur.execute(sql.SQL("TRUNCATE {}").format(self._staging))
            else:
                for xid, subxid in batch.unstage:
                    if subxid is None:
                        cur.execute(sql.SQL("DELETE FROM {} WHERE xid = %s").format(
                            self._staging), (xid,))
                    else:
                        cur.execute(sql.SQL("DELETE FROM {} WHERE xid = %s AND subxid = %s")
                                    .format(self._staging), (xid, subxid))
            if batch.messages:
                cur.executemany(
                    "INSERT INTO lakefold.capture_messages (slot_name, lsn, commit_lsn, ordinal, "
                    "transactional, prefix, content) VALUES (%s, %s, %s, %s, %s, %s, %s) "
                    "ON CONFLICT DO NOTHING",
                    [(self._slot, m.lsn, m.commit_lsn, m.ordinal, m.transactional, m.prefix,
                      m.content) for m in batch.messages],
                )
            for action in batch.actions:
                action(cur)
            if batch.heads:
                ids = list(batch.heads)
                cur.execute(
                    "WITH moved AS (UPDATE lakefold.changelog_streams s SET head = v.head, "
                    "last_commit_ts = COALESCE(timestamptz '2000-01-01 00:00:00+00' "
                    "+ v.ts * interval '1 microsecond', s.last_commit_ts) "
                    "FROM unnest(%s::int[], %s::bigint[], %s::bigint[]) v(id, head, ts) "
                    "WHERE s.stream_id = v.id RETURNING s.name) "
                    "SELECT pg_notify(%s, name) FROM moved",
                    (ids, [batch.heads[i] for i in ids], [batch.head_ts.get(i) for i in ids],
                     NOTIFY_CHANNEL),
                )
            if batch.checkpoint is not None:
                ck = batch.checkpoint
                cur.execute(
                    "UPDATE lakefold.capture_slots SET commit_lsn = %s, ordinal = %s, "
                    "complete = %s, flush_lsn = greatest(flush_lsn, %s), "
                    "records = records + %s, updated_at = now() WHERE slot_name = %s",
                    (ck.commit_lsn, ck.ordinal, ck.complete, ck.flush_lsn, batch.records,
                     self._slot),
                )
                if cur.rowcount != 1:
                    raise StoreError(
                        f"slot {self._slot!r} vanished from lakefold.capture_slots while "
                        "capturing; was the slot dropped? Restart the capture to set it up again"
                    )

    def _check_owner(self, cur: psycopg.Cursor[Any]) -> None:
        """Fencing (see ``_slot_ownership``): a read in the batch's own transaction, so a new owner,
        which ends earlier owners' sessions after writing its token, sees every batch that
        passed this check."""
        row = cur.execute("SELECT token FROM lakefold.capture_owners WHERE slot_name = %s",
                          (self._slot,)).fetchone()
        if row is None or row[0] != self._owner:
            raise OwnershipLostError(
                f"this capture lost slot {self._slot!r}: another capture owns it now, so this "
                "batch was not written. It stopped and does not take the slot back by itself; "
                "start it again with --take-over if it should be the one capturing")

    @staticmethod
    def _copy(cur: psycopg.Cursor[Any], statement: str | sql.Composed,
              rows: list[bytes]) -> None:
        with cur.copy(statement) as copy:
            copy.write(COPY_HEADER)
            # Write in slices of a few MB: one huge join would double peak memory.
            chunk: list[bytes] = []
            size = 0
            for row in rows:
                chunk.append(row)
                size += len(row)
                if size >= 4 << 20:
                    copy.write(b"".join(chunk))
                    chunk.clear()
                    size = 0
            if chunk:
                copy.write(b"".join(chunk))
            copy.write(COPY_TRAILER)

    def _move_streamed(self, cur: psycopg.Cursor[Any], commit: StreamedCommit) -> None:
        params = {
            "commit_lsn": commit.commit_lsn, "xid": commit.xid, "ts": commit.commit_ts,
            "aborted": list(commit.aborted_subxids), "skip": commit.skip_ordinal,
            "ids": [s for s, _ in commit.bases], "bases": [b for _, b in commit.bases],
        }
        if commit.exact:
            # Staged sequence numbers are final: no sort, no window function.
            query = sql.SQL(
                "INSERT INTO lakefold.changelog (stream_id, position, ordinal, commit_lsn, xid, "
                "commit_ts, schema_version, op, key, before, after) "
                "SELECT st.stream_id, b.base + st.stream_seq - 1, st.seq, %(commit_lsn)s, "
                "%(xid)s, timestamptz '2000-01-01 00:00:00+00' + %(ts)s * interval '1 "
                "microsecond', st.schema_version, st.op, st.key, st.before, st.after "
                "FROM {} st JOIN unnest(%(ids)s::int[], %(bases)s::bigint[]) b(stream_id, base) "
                "USING (stream_id) WHERE st.xid = %(xid)s").format(self._staging)
        else:
            query = sql.SQL(
                "INSERT INTO lakefold.changelog (stream_id, position, ordinal, commit_lsn, xid, "
                "commit_ts, schema_version, op, key, before, after) "
                "SELECT s.stream_id, b.base + row_number() OVER (PARTITION BY s.stream_id "
                "ORDER BY s.ordinal) - 1, s.ordinal, %(commit_lsn)s, %(xid)s, "
                "timestamptz '2000-01-01 00:00:00+00' + %(ts)s * interval '1 microsecond', "
                "s.schema_version, s.op, s.key, s.before, s.after "
                "FROM (SELECT st.*, row_number() OVER (ORDER BY st.seq) AS ordinal FROM {} st "
                "      WHERE st.xid = %(xid)s AND st.subxid <> ALL(%(aborted)s::bigint[])) s "
                "JOIN unnest(%(ids)s::int[], %(bases)s::bigint[]) b(stream_id, base) "
                "USING (stream_id) WHERE s.ordinal > %(skip)s").format(self._staging)
        cur.execute(query, params)
