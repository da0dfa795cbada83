"""The stateful pgoutput decoder: XLogData messages in, store ``Batch``es out.

This is the capture's hot path. Insert, Update and Delete are read in place with ``struct``
and turned straight into binary-COPY rows (no per-row objects): the tuple's text values are
already length-prefixed, which is exactly how a ``text[]`` stores its elements.

Per source transaction the decoder assigns each record an ordinal (1, 2, ... in the order the
server sends them, which is the order of the changes in the WAL) and, per stream, the next
position. The head of a stream moves only at the transaction's commit. Records the checkpoint
says are stored (``Checkpoint.covers``) are skipped, which is how a restarted capture
de-duplicates by ``(commit_lsn, ordinal)``.

Streamed transactions (protocol v2, ``streaming 'on'``) are staged: their rows go to the
slot's staging table as they arrive and get positions and ordinals when the Stream Commit
arrives (aborted subtransactions are left out). A key change (an Update whose old key differs
from the new one) becomes a delete of the old key followed by an insert of the new one, so
that compaction by key keeps exactly the table's rows.
"""

from __future__ import annotations

import logging
import struct
from array import array
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol

from lakefold.capture.decoding import _pgoutput as pgo
from lakefold.capture.exceptions import DecodingError
from lakefold.core.wal import format_lsn
from lakefold.store.internals import (
    NULL_FIELD,
    Batch,
    CapturedMessage,
    Checkpoint,
    SlotState,
    StreamedCommit,
    StreamSchema,
)

log = logging.getLogger(__name__)

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_ROW_HEAD = struct.Struct(">hiqiq")  # field count, position, ordinal
_STAGE_HEAD = struct.Struct(">hiqiqiqiq")  # field count, xid, subxid, seq, stream_seq
_TXN = struct.Struct(">iqiqiq")  # commit_lsn, xid, commit_ts
_REL = struct.Struct(">iiii")  # stream_id, schema_version
_ARRAY = struct.Struct(">iiiiii")

_OP_INSERT: Final = b"\x00\x00\x00\x01i"
_OP_UPDATE: Final = b"\x00\x00\x00\x01u"
_OP_DELETE: Final = b"\x00\x00\x00\x01d"
_OP_TRUNCATE: Final = b"\x00\x00\x00\x01t"

_T: Final = 0x74  # 't'
_N: Final = 0x6E  # 'n'
_U: Final = 0x75  # 'u'
_B: Final = 0x62  # 'b'


class SchemaResolver(Protocol):
    """Turns a Relation message into a stream schema (resolving types and keys)."""

    def note_type(self, message: pgo.Type) -> None: ...

    def relation_schema(self, message: pgo.Relation, *, stream: str) -> StreamSchema: ...


class StreamRegistry(Protocol):
    """Creates streams and schema versions in the store (committed immediately)."""

    def ensure_stream(self, name: str, *, database: str, schema: str, table: str) -> int: ...

    def register_schema(self, stream_id: int, schema: StreamSchema, *, lsn: int) -> int: ...


class DecoderHooks(Protocol):
    """The decoder's extension for lakefold's in-band features (snapshot chunks, heartbeats,
    publication changes, unchanged TOAST: ``_inband_messages.DecoderExtension``), called at five
    hook points. It is given to the decoder rather than made by it, so that the extension, which
    works on the decoder's internals, depends on the decoder and not the other way round."""

    def handle_message(self, decoder: Decoder, message: pgo.Message) -> bool: ...

    def unchanged_update(self, d: Decoder, rel: Any, subxid: int, old_key: bytes | None,
                         key: bytes, before: bytes | None, after: bytes) -> None: ...

    def stream_committed(self, d: Decoder, txn: Any, *, commit_lsn: int, aborted: set[int],
                         skip: int, bases: dict[int, int]) -> None: ...

    def stream_dropped(self, xid: int) -> None: ...


@dataclass(frozen=True, slots=True)
class DecoderOptions:
    """``stream_prefix`` is put before ``schema.table`` to name streams; ``keep_messages``
    stores logical decoding messages; batches are handed over at ``batch_rows`` records or
    ``batch_bytes`` bytes, whichever comes first."""

    database: str
    stream_prefix: str = ""
    keep_messages: bool = False
    batch_rows: int = 20_000
    batch_bytes: int = 8 << 20
    slot: str = ""  # the capture's slot: in-band snapshot chunks addressed to it are applied
    publication: str = ""  # the capture's publication: its tables joining or leaving it


class _Stream:
    __slots__ = ("head", "name", "next_position", "schema", "stream_id")

    def __init__(self, stream_id: int, name: str, head: int, next_position: int,
                 schema: StreamSchema | None) -> None:
        self.stream_id = stream_id
        self.name = name
        self.head = head
        self.next_position = next_position
        self.schema = schema


class _Rel:
    __slots__ = ("array_tail", "key_idx", "key_tail", "rel_field", "relid", "schema", "stream",
                 "version")

    def __init__(self, relid: int, stream: _Stream, schema: StreamSchema, version: int) -> None:
        self.relid = relid
        self.stream = stream
        self.schema = schema
        self.version = version
        self.key_idx = tuple(i for i, c in enumerate(schema.columns) if c.key)
        self.rel_field = _REL.pack(4, stream.stream_id, 4, version)
        self.array_tail = len(schema.columns)
        self.key_tail = len(self.key_idx)


@dataclass
class _StreamedTxn:
    xid: int
    seq: int = 0
    stream_counts: dict[int, int] = field(default_factory=dict)
    streams: array[int] = field(default_factory=lambda: array("i"))
    subxids: array[int] = field(default_factory=lambda: array("q"))
    aborted: set[int] = field(default_factory=set)


class Decoder:
    """Feed it XLogData payloads in order with ``feed``; take batches with ``take_batch``."""

    def __init__(self, state: SlotState, *, resolver: SchemaResolver,
                 registry: StreamRegistry, options: DecoderOptions,
                 hooks: DecoderHooks) -> None:
        self._resolver = resolver
        self._registry = registry
        self._options = options
        self._checkpoint = state.checkpoint
        self._streams: dict[str, _Stream] = {
            s.name: _Stream(s.stream_id, s.name, s.head, s.next_position, s.schema)
            for s in state.streams
        }
        # A partial transaction left by an earlier run must be the first one we see again.
        self._orphan_check = not state.checkpoint.complete
        self._relations: dict[int, _Rel] = {}
        self._announced: dict[int, pgo.Relation] = {}  # Relation messages without changes yet
        self._batch = Batch()
        self._dirty = False
        # snapshot chunks, heartbeats, unchanged TOAST (``_inband_messages``); indexes of 'u' values
        self._ext = hooks
        self._unchanged: list[int] = []
        # the open (non-streamed) transaction
        self._in_txn = False
        self._final_lsn = 0
        self._xid = 0
        self._commit_ts = 0
        self._txn_field = b""
        self._ordinal = 0
        self._skip_upto = 0  # ordinals <= this are stored already; -1: skip all
        self._touched: set[_Stream] = set()
        # streamed transactions
        self._stream_xid: int | None = None
        self._streamed: dict[int, _StreamedTxn] = {}
        self._flush_lsn = state.checkpoint.flush_lsn
        self.last_commit_lsn = state.checkpoint.commit_lsn

    # -- state for the capture loop --------------------------------------------------------

    @property
    def flush_lsn(self) -> int:
        """End LSN of the last complete transaction decoded (stored once its batch is)."""
        return self._flush_lsn

    @property
    def in_transaction(self) -> bool:
        """True inside Begin..Commit or inside a stream block."""
        return self._in_txn or self._stream_xid is not None

    @property
    def batch_full(self) -> bool:
        batch = self._batch
        return batch.size >= self._options.batch_bytes or \
            len(batch.rows) + len(batch.staging) >= self._options.batch_rows

    @property
    def has_pending(self) -> bool:
        return self._dirty

    def take_batch(self) -> Batch:
        """The batch built so far, with its checkpoint; a new one is started."""
        batch = self._batch
        if self._in_txn and self._skip_upto >= 0 and self._ordinal > self._skip_upto:
            batch.checkpoint = Checkpoint(self._final_lsn, self._ordinal, False, self._flush_lsn)
        else:
            ck = self._checkpoint
            batch.checkpoint = Checkpoint(ck.commit_lsn, ck.ordinal, ck.complete,
                                          self._flush_lsn)
        self._checkpoint = batch.checkpoint
        if not self._streamed and (batch.commits or batch.unstage):
            batch.truncate_staging = True  # no streamed transaction is open any more
        self._batch = Batch()
        self._dirty = False
        return batch

    # -- dispatch --------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Decode one XLogData message (``'w'`` + 24 header bytes + pgoutput message)."""
        kind = data[25]
        try:
            if kind == 0x49 and self._stream_xid is None:  # 'I' outside a stream block
                rel = self._relations.get(_U32.unpack_from(data, 26)[0])
                if rel is None:
                    rel = self._rel(_U32.unpack_from(data, 26)[0])
                after, key, _ = self._tuple(data, 31, rel)
                self._emit(rel, _OP_INSERT, key, NULL_FIELD, after, 0)
            elif kind == 0x49:
                self._insert(data)
            elif kind == 0x55:  # 'U'
                self._update(data)
            elif kind == 0x44:  # 'D'
                self._delete(data)
            else:
                self._control(pgo.parse_message(data[25:], in_stream=self._stream_xid is not None))
        except (struct.error, IndexError) as e:
            raise DecodingError(f"malformed pgoutput message {chr(kind)!r}: {e}") from e

    def _control(self, message: pgo.PgOutputMessage) -> None:
        if isinstance(message, pgo.Begin):
            self._begin(message)
        elif isinstance(message, pgo.Commit):
            self._commit(message)
        elif isinstance(message, pgo.Relation):
            self._relation(message)
        elif isinstance(message, pgo.Type):
            self._resolver.note_type(message)
        elif isinstance(message, pgo.Truncate):
            self._truncate(message)
        elif isinstance(message, pgo.Message):
            self._message(message)
        elif isinstance(message, pgo.Origin):
            log.debug("transaction %d replicated from origin %s", self._xid, message.name)
        elif isinstance(message, pgo.StreamStart):
            self._stream_xid = message.xid
            self._streamed.setdefault(message.xid, _StreamedTxn(message.xid))
        elif isinstance(message, pgo.StreamStop):
            self._stream_xid = None
        elif isinstance(message, pgo.StreamCommit):
            self._stream_commit(message)
        elif isinstance(message, pgo.StreamAbort):
            self._stream_abort(message)
        else:  # Insert/Update/Delete are handled on the hot path
            raise DecodingError(f"unexpected message {message!r}")

    # -- transactions ----------------------------------------------------------------------

    def _begin(self, message: pgo.Begin) -> None:
        self._check_orphans(message.final_lsn)
        self._in_txn = True
        self._final_lsn = message.final_lsn
        self._xid = message.xid
        self._commit_ts = message.commit_ts
        self._txn_field = _TXN.pack(8, message.final_lsn, 8, message.xid, 8, message.commit_ts)
        self._ordinal = 0
        ck = self._checkpoint
        if message.final_lsn < ck.commit_lsn or (message.final_lsn == ck.commit_lsn
                                                 and ck.complete):
            self._skip_upto = -1
        elif message.final_lsn == ck.commit_lsn:
            # The rest of a transaction an earlier run stored in part: its stored rows sit
            # beyond the heads, which move when it commits.
            self._skip_upto = ck.ordinal
            self._touched.update(s for s in self._streams.values()
                                 if s.next_position - 1 > s.head)
        else:
            self._skip_upto = 0

    def _check_orphans(self, commit_lsn: int) -> None:
        if not self._orphan_check or commit_lsn < self._checkpoint.commit_lsn:
            return
        self._orphan_check = False
        if commit_lsn > self._checkpoint.commit_lsn:
            self._drop_orphans()

    def _drop_orphans(self) -> None:
        """Rows of a partial transaction that the server will not send again (the slot moved
        past it): drop them and reuse their positions."""
        log.warning("dropping the unfinished transaction at commit LSN %s left by an earlier "
                    "run: the slot no longer sends it", format_lsn(self._checkpoint.commit_lsn))
        for stream in self._streams.values():
            stream.next_position = stream.head + 1
        self._batch.drop_invisible.extend(s.stream_id for s in self._streams.values())
        ck = self._checkpoint
        self._checkpoint = Checkpoint(ck.commit_lsn, ck.ordinal, True, ck.flush_lsn)
        self._dirty = True

    def _commit(self, message: pgo.Commit) -> None:
        batch = self._batch
        if self._skip_upto >= 0:
            for stream in self._touched:
                stream.head = stream.next_position - 1
                batch.heads[stream.stream_id] = stream.head
                batch.head_ts[stream.stream_id] = message.commit_ts
            self._touched.clear()
            self._checkpoint = Checkpoint(self._final_lsn, self._ordinal, True, self._flush_lsn)
        self._in_txn = False
        self.last_commit_lsn = message.commit_lsn
        self._flush_lsn = max(self._flush_lsn, message.end_lsn)
        self._dirty = True

    # -- streamed transactions (protocol v2) -----------------------------------------------

    def _stream_commit(self, message: pgo.StreamCommit) -> None:
        self._check_orphans(message.commit_lsn)
        txn = self._streamed.pop(message.xid, None) or _StreamedTxn(message.xid)
        batch = self._batch
        ck = self._checkpoint
        if message.commit_lsn < ck.commit_lsn or (message.commit_lsn == ck.commit_lsn
                                                  and ck.complete):
            batch.unstage.append((txn.xid, None))  # stored by an earlier run
            self._ext.stream_dropped(txn.xid)
        else:
            resumed = message.commit_lsn == ck.commit_lsn
            skip = ck.ordinal if resumed else 0
            aborted = txn.aborted
            if not aborted and not skip:
                counts = dict(txn.stream_counts)
                ordinal = txn.seq
            else:
                counts = {}
                ordinal = 0
                for stream_id, subxid in zip(txn.streams, txn.subxids, strict=True):
                    if aborted and subxid in aborted:
                        continue
                    ordinal += 1
                    if ordinal > skip:
                        counts[stream_id] = counts.get(stream_id, 0) + 1
            by_id = {s.stream_id: s for s in self._streams.values()}
            bases = []
            moved = {by_id[i] for i in counts}
            if resumed:
                moved.update(s for s in self._streams.values() if s.next_position - 1 > s.head)
            for stream in moved:
                count = counts.get(stream.stream_id, 0)
                if count:
                    bases.append((stream.stream_id, stream.next_position))
                stream.next_position += count
                stream.head = stream.next_position - 1
                batch.heads[stream.stream_id] = stream.head
                batch.head_ts[stream.stream_id] = message.commit_ts
            batch.commits.append(StreamedCommit(
                txn.xid, message.commit_lsn, message.commit_ts, tuple(sorted(aborted)),
                skip, tuple(bases)))
            self._ext.stream_committed(self, txn, commit_lsn=message.commit_lsn,
                                       aborted=aborted, skip=skip, bases=dict(bases))
            batch.records += sum(counts.values())
            self._checkpoint = Checkpoint(message.commit_lsn, ordinal, True, self._flush_lsn)
        self.last_commit_lsn = message.commit_lsn
        self._flush_lsn = max(self._flush_lsn, message.end_lsn)
        self._dirty = True

    def _stream_abort(self, message: pgo.StreamAbort) -> None:
        txn = self._streamed.get(message.xid)
        if message.subxid == message.xid:
            self._streamed.pop(message.xid, None)
            self._batch.unstage.append((message.xid, None))
            self._ext.stream_dropped(message.xid)
        elif txn is not None:
            txn.aborted.add(message.subxid)
            self._batch.unstage.append((message.xid, message.subxid))
        self._dirty = True

    # -- relations -------------------------------------------------------------------------

    def _relation(self, message: pgo.Relation) -> None:
        """Note a Relation message; its stream is made when a change of the relation comes.

        With ``publish_via_partition_root`` pgoutput sends a partition's own Relation message
        after its root's, although the changes name the root: a stream made eagerly would be
        an empty stream per partition."""
        self._relations.pop(message.relid, None)
        self._announced[message.relid] = message

    def _stream_of(self, message: pgo.Relation) -> _Rel:
        name = f"{self._options.stream_prefix}{message.namespace}.{message.name}"
        schema = self._resolver.relation_schema(message, stream=name)
        stream = self._streams.get(name)
        if stream is None:
            stream_id = self._registry.ensure_stream(
                name, database=self._options.database, schema=message.namespace,
                table=message.name)
            stream = _Stream(stream_id, name, 0, 1, None)
            self._streams[name] = stream
        if self._stream_xid is None and self._skip_upto < 0 and stream.schema is not None:
            # A transaction an earlier run stored whole, decoded again after a restart: none of
            # its changes is written, so none registers its shape (a version no record would
            # carry). The relation is resolved again for the next change.
            self._announced[message.relid] = message
            return _Rel(message.relid, stream, schema, stream.schema.version)
        if not schema.key_columns:
            # No primary key and no replica identity index right now: a keyless version,
            # keyed by the stream's last key or the whole row (see StreamSchema).
            schema = schema.without_key(stream.schema)
            log.warning("table %s.%s has no primary key: its changes are keyed by (%s) until "
                        "a key returns", message.namespace, message.name,
                        ", ".join(schema.key_columns))
        if stream.schema is not None and stream.schema.same_shape(schema):
            version = stream.schema.version
        else:
            version = self._registry.register_schema(stream.stream_id, schema,
                                                     lsn=self._final_lsn)
            stream.schema = replace(schema, version=version)
        rel = _Rel(message.relid, stream, schema, version)
        self._relations[message.relid] = rel
        return rel

    def _rel(self, relid: int) -> _Rel:
        rel = self._relations.get(relid)
        if rel is not None:
            return rel
        announced = self._announced.pop(relid, None)
        if announced is None:
            raise DecodingError(
                f"change for relation {relid} before its Relation message; the stream is out "
                "of order (restart the capture)"
            )
        return self._stream_of(announced)

    # -- rows (hot path) -------------------------------------------------------------------

    def _tuple(self, data: bytes, off: int, rel: _Rel) -> tuple[bytes, bytes, int]:
        """Read a TupleData at ``off``: returns (text[] field, key field, next offset)."""
        unpack = _I32.unpack_from
        count = (data[off] << 8) | data[off + 1]
        off += 2
        parts: list[bytes] = []
        append = parts.append
        for _ in range(count):
            kind = data[off]
            if kind == _T:
                end = off + 5 + unpack(data, off + 1)[0]
                append(data[off + 1:end])
                off = end
            elif kind == _N:
                append(NULL_FIELD)
                off += 1
            elif kind == _U:  # unchanged TOASTed value: filled by _inband_messages.unchanged_update
                self._unchanged.append(len(parts))
                append(NULL_FIELD)
                off += 1
            elif kind == _B:
                end = off + 5 + unpack(data, off + 1)[0]
                append(data[off + 1:end])
                off = end
            else:
                raise DecodingError(f"unknown tuple column kind {kind!r}")
        body = b"".join(parts)
        idx = rel.key_idx
        kb = parts[idx[0]] if len(idx) == 1 else b"".join([parts[i] for i in idx])
        return (_ARRAY.pack(20 + len(body), 1, 0, 25, count, 1) + body,
                _I32.pack(len(kb)) + kb, off)

    def _emit(self, rel: _Rel, op: bytes, key: bytes, before: bytes, after: bytes,
              subxid: int) -> None:
        streamed = self._stream_xid
        batch = self._batch
        if streamed is None:
            self._ordinal += 1
            if self._skip_upto < 0 or self._ordinal <= self._skip_upto:
                return
            stream = rel.stream
            position = stream.next_position
            stream.next_position = position + 1
            self._touched.add(stream)
            row = b"".join((_ROW_HEAD.pack(11, 8, position, 8, self._ordinal), self._txn_field,
                            rel.rel_field, op, key, before, after))
            batch.rows.append(row)
        else:
            txn = self._streamed[streamed]
            txn.seq += 1
            stream_id = rel.stream.stream_id
            stream_seq = txn.stream_counts.get(stream_id, 0) + 1
            txn.stream_counts[stream_id] = stream_seq
            txn.streams.append(stream_id)
            txn.subxids.append(subxid)
            row = b"".join((_STAGE_HEAD.pack(10, 8, streamed, 8, subxid, 8, txn.seq, 8,
                                             stream_seq),
                            rel.rel_field, op, key, before, after))
            batch.staging.append(row)
            batch.size += len(row)
            self._dirty = True
            return
        batch.size += len(row)
        batch.records += 1
        self._dirty = True

    def _header(self, data: bytes) -> tuple[int, int]:
        """(subxid, offset of the relid) of an Insert/Update/Delete message."""
        if self._stream_xid is None:
            return self._xid, 26
        return _U32.unpack_from(data, 26)[0], 30

    def _insert(self, data: bytes) -> None:
        subxid, off = self._header(data)
        rel = self._rel(_U32.unpack_from(data, off)[0])
        after, key, _ = self._tuple(data, off + 5, rel)
        self._emit(rel, _OP_INSERT, key, NULL_FIELD, after, subxid)

    def _update(self, data: bytes) -> None:
        subxid, off = self._header(data)
        rel = self._rel(_U32.unpack_from(data, off)[0])
        off += 4
        marker = data[off]
        if marker == 0x4E:  # 'N': no old image
            after, key, _ = self._tuple(data, off + 1, rel)
            if self._unchanged:
                self._ext.unchanged_update(self, rel, subxid, None, key, None, after)
                return
            self._emit(rel, _OP_UPDATE, key, NULL_FIELD, after, subxid)
            return
        before, old_key, off = self._tuple(data, off + 1, rel)
        self._unchanged.clear()
        after, key, _ = self._tuple(data, off + 1, rel)
        if self._unchanged:
            self._ext.unchanged_update(self, rel, subxid, old_key, key, before, after)
        elif old_key != key:
            self._emit(rel, _OP_DELETE, old_key, before, NULL_FIELD, subxid)
            self._emit(rel, _OP_INSERT, key, NULL_FIELD, after, subxid)
        else:
            self._emit(rel, _OP_UPDATE, key, before, after, subxid)

    def _delete(self, data: bytes) -> None:
        subxid, off = self._header(data)
        rel = self._rel(_U32.unpack_from(data, off)[0])
        before, key, _ = self._tuple(data, off + 5, rel)
        self._emit(rel, _OP_DELETE, key, before, NULL_FIELD, subxid)

    def _truncate(self, message: pgo.Truncate) -> None:
        subxid = message.xid if message.xid is not None else self._xid
        for relid in message.relids:
            rel = self._rel(relid)
            self._emit(rel, _OP_TRUNCATE, NULL_FIELD, NULL_FIELD, NULL_FIELD, subxid)

    def truncate_stream(self, name: str, relid: int, subxid: int) -> bool:
        """Emit a truncate record for stream ``name`` at this point of the open transaction
        (its latest schema version); False when the stream has no records yet."""
        stream = self._streams.get(name)
        if stream is None or stream.schema is None:
            return False
        rel = _Rel(relid, stream, stream.schema, stream.schema.version)
        self._emit(rel, _OP_TRUNCATE, NULL_FIELD, NULL_FIELD, NULL_FIELD, subxid)
        return True

    def _message(self, message: pgo.Message) -> None:
        if self._ext.handle_message(self, message):
            return  # a snapshot chunk or heartbeat (see _inband_messages)
        if not self._options.keep_messages:
            return
        if message.transactional:
            if self._stream_xid is not None:
                return  # messages of streamed transactions are not kept (rare; documented)
            if self._skip_upto < 0:
                return
            commit_lsn: int | None = self._final_lsn
            ordinal = self._ordinal  # how many changes of the transaction came before it
        else:
            commit_lsn, ordinal = None, 0
        self._batch.messages.append(pgo_message(message, commit_lsn, ordinal))
        self._dirty = True


def pgo_message(message: pgo.Message, commit_lsn: int | None, ordinal: int) -> CapturedMessage:
    return CapturedMessage(message.lsn, commit_lsn, ordinal, message.transactional,
                           message.prefix, message.content)
