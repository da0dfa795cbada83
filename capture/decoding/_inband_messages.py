"""In-band capture messages, decoded in stream order: snapshot chunks, heartbeats, and the
decoder side of unchanged-TOAST filling.

Snapshot chunks (prefix ``lakefold.snapshot``)
    An incremental snapshot (``_incremental_snapshot``) reads a chunk of a table's rows while
    holding share locks on them and, still holding them, writes the rows into the source's WAL as
    one non-transactional logical decoding message. Every change of those rows committed before
    the message is older than the rows; every later change waits for the locks, so it commits
    after the message. The decoder turns the message into ``read`` records at exactly that
    point of the stream, which therefore stays consistent per key with no pause of the stream.
    The payload is ``MAGIC``, a JSON header (slot, snapshot id, the table's Relation
    description, row count, time) and the rows as pgoutput TupleData, so the decoder's own
    tuple reader turns them into records. Chunks addressed to another slot are ignored.

Heartbeats (prefix ``lakefold.heartbeat``)
    Written by the capture every ``HeartbeatPolicy.interval``. Receiving one outside any
    transaction lets the slot confirm the heartbeat's LSN even when no captured table changed
    (the WAL written elsewhere is released); the capture's own heartbeats are stored with the
    batch, mapping LSNs to times for the lag in seconds.

Publication changes (prefix ``lakefold.publication``, transactional)
    Written by the publication guard or ``_publishable.reconcile`` in the transaction that
    changes the capture's publication. A table that joined gets, at that point of the
    stream, a truncate record when its stream already has records (its rows may have changed
    or been deleted while it was out), and an incremental snapshot run, recorded in the same
    store transaction as the batch and executed by the capture's side thread (``_control``):
    its stream then equals the table again. A table that left keeps its stream as it was
    (logged as a warning); one that rejoined within one transaction without changes needs
    nothing.

Event commit markers (prefix ``lakefold.event_commit``, transactional)
    Written by every event store append once markers are installed
    (``eventstore._commit_markers``): the appending transaction's id, stored with its commit
    LSN in ``lakefold.event_commits`` (for a streamed transaction, when it commits), so views
    can place each event in the database's commit order next to the captured tables.

Records of a chunk use ``commit_lsn`` = the message's LSN minus one (pgoutput reports the end
of the message's WAL record, which can equal the next commit's LSN) and ordinals 1..n, so a
restarted capture de-duplicates them like any transaction (``Checkpoint.covers``).

This module works on the decoder's internals on purpose: it is the decoder's extension, kept
apart so that the hot path stays small. ``Decoder`` calls it at five hook points
(``DecoderHooks``); the capture gives each decoder its extension.
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

import psycopg

from lakefold.capture.decoding import _pgoutput as pgo, _publishable
from lakefold.capture.decoding._decoder import Decoder
from lakefold.capture.decoding._toast_fill import FillItem, ToastFill, fill_from_before
from lakefold.capture.exceptions import DecodingError
from lakefold.core.wal import COMMIT_MARKER_PREFIX
from lakefold.store.internals import NULL_FIELD, Batch, Checkpoint, capture_state

log = logging.getLogger(__name__)

SNAPSHOT_PREFIX: Final = "lakefold.snapshot"
HEARTBEAT_PREFIX: Final = "lakefold.heartbeat"
MAGIC: Final = b"LFS1"

_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_ROW_HEAD = struct.Struct(">hiqiq")  # field count, position, ordinal
_TXN = struct.Struct(">iqiqiq")  # commit_lsn, xid, commit_ts
_OP_READ: Final = b"\x00\x00\x00\x01r"
_OP_INSERT: Final = b"\x00\x00\x00\x01i"
_OP_UPDATE: Final = b"\x00\x00\x00\x01u"
_OP_DELETE: Final = b"\x00\x00\x00\x01d"


# -- chunk payloads ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ChunkHeader:
    """What a snapshot chunk message says about its rows."""

    slot: str
    snapshot_id: int
    relation: pgo.Relation
    rows: int
    at: int  # PostgreSQL protocol timestamp of the read

    def as_json(self) -> bytes:
        rel = self.relation
        return json.dumps({
            "slot": self.slot, "snapshot": self.snapshot_id, "relid": rel.relid,
            "namespace": rel.namespace, "name": rel.name, "identity": rel.replica_identity,
            "columns": [[c.name, c.type_oid, c.type_modifier, c.key] for c in rel.columns],
            "rows": self.rows, "at": self.at,
        }, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> ChunkHeader:
        doc = json.loads(raw)
        columns = tuple(pgo.RelationColumn(bool(key), str(name), int(oid), int(mod))
                        for name, oid, mod, key in doc["columns"])
        relation = pgo.Relation(None, int(doc["relid"]), str(doc["namespace"]),
                                str(doc["name"]), str(doc["identity"]), columns)
        return cls(str(doc["slot"]), int(doc["snapshot"]), relation, int(doc["rows"]),
                   int(doc["at"]))


def encode_tuple(values: tuple[str | None, ...] | list[str | None]) -> bytes:
    """One row as pgoutput TupleData (every value in text form, or NULL)."""
    out = [_I16.pack(len(values))]
    for value in values:
        if value is None:
            out.append(b"n")
        else:
            raw = value.encode()
            out.append(b"t" + _I32.pack(len(raw)) + raw)
    return b"".join(out)


def encode_chunk(header: ChunkHeader, rows: list[bytes]) -> bytes:
    """A chunk message's content: MAGIC, header length, header JSON, TupleData rows."""
    head = header.as_json()
    return b"".join((MAGIC, _U32.pack(len(head)), head, *rows))


def decode_chunk_header(content: bytes) -> tuple[ChunkHeader, int]:
    """The header of a chunk message and the offset of its first row."""
    if content[:4] != MAGIC:
        raise DecodingError("a lakefold.snapshot message without the expected format marker; "
                            "was it written by another lakefold version?")
    (length,) = _U32.unpack_from(content, 4)
    return ChunkHeader.from_json(content[8:8 + length]), 8 + length


def encode_heartbeat(slot: str, at: datetime) -> bytes:
    return json.dumps({"slot": slot, "at": at.isoformat()}).encode()


# -- store actions -------------------------------------------------------------------------

@dataclass
class _StoreHeartbeats:
    slot: str
    beats: list[tuple[int, datetime]] = field(default_factory=list)

    def __call__(self, cur: psycopg.Cursor[Any]) -> None:
        capture_state.store_heartbeats(cur, self.slot, self.beats)


@dataclass
class _StoreEventCommits:
    slot: str
    commits: list[tuple[int, int]] = field(default_factory=list)

    def __call__(self, cur: psycopg.Cursor[Any]) -> None:
        capture_state.store_event_commits(cur, self.slot, self.commits)


@dataclass
class _PlanResnapshot:
    """Record an incremental snapshot run of tables that joined the publication (relid ->
    (relid, schema, table, stream)) and wake the capture's side thread."""

    slot: str
    tables: dict[int, tuple[int, str, str, str]] = field(default_factory=dict)

    def __call__(self, cur: psycopg.Cursor[Any]) -> None:
        capture_state.insert_run(cur, slot=self.slot, kind="incremental",
                                  consistent_lsn=None, tables=list(self.tables.values()))
        cur.execute("SELECT pg_notify(%s, %s)", (capture_state.CONTROL_CHANNEL, self.slot))


@dataclass
class _StagedFill:
    seq: int
    stream_id: int
    stream_seq: int
    source_key: bytes
    indexes: tuple[int, ...]
    columns: tuple[str, ...]


def _action(batch: Batch, kind: type[Any], *args: Any) -> Any:
    for action in batch.actions:
        if isinstance(action, kind):
            return action
    created = kind(*args)
    batch.actions.append(created)
    return created


# -- the decoder extension -----------------------------------------------------------------

class DecoderExtension:
    """Per-decoder state of the in-band features; see the module docstring."""

    def __init__(self, slot: str, *, publication: str = "", stream_prefix: str = "") -> None:
        self.slot = slot
        self.publication = publication
        self.stream_prefix = stream_prefix
        self._streamed_fills: dict[int, list[_StagedFill]] = {}
        self._streamed_joins: dict[int, dict[int, tuple[int, str, str, str]]] = {}
        self._streamed_markers: dict[int, set[int]] = {}
        self.snapshot_rows = 0

    # messages

    def handle_message(self, decoder: Decoder, message: pgo.Message) -> bool:
        """Consume lakefold's own messages; False for anything else."""
        if message.transactional:
            if message.prefix == _publishable.MESSAGE_PREFIX:
                self._publication(decoder, message)
                return True
            if message.prefix == COMMIT_MARKER_PREFIX:
                self._event_commit(decoder, message)
                return True
            return False
        if message.prefix == SNAPSHOT_PREFIX:
            self._chunk(decoder, message)
            return True
        if message.prefix == HEARTBEAT_PREFIX:
            self._heartbeat(decoder, message)
            return True
        return False

    def _chunk(self, d: Decoder, message: pgo.Message) -> None:
        header, offset = decode_chunk_header(message.content)
        if header.slot != self.slot:
            return
        if d._stream_xid is not None or d._in_txn:
            raise DecodingError("a snapshot chunk arrived inside a transaction; the stream is "
                                "out of order (restart the capture)")
        # pgoutput gives a message the END of its WAL record, which may be exactly the start of
        # the next transaction's commit record (that transaction's commit LSN). One less is
        # still after every earlier commit and before every later one, and unique.
        lsn = message.lsn - 1
        d._check_orphans(lsn)
        if d._checkpoint.covers(lsn, 1):
            return  # stored by an earlier run
        d._relation(header.relation)
        rel = d._rel(header.relation.relid)
        stream = rel.stream
        txn = _TXN.pack(8, lsn, 8, 0, 8, header.at)
        batch = d._batch
        content = message.content
        for ordinal in range(1, header.rows + 1):
            after, key, offset = d._tuple(content, offset, rel)
            position = stream.next_position
            stream.next_position = position + 1
            row = b"".join((_ROW_HEAD.pack(11, 8, position, 8, ordinal), txn, rel.rel_field,
                            _OP_READ, key, NULL_FIELD, after))
            batch.rows.append(row)
            batch.size += len(row)
        d._unchanged.clear()
        batch.records += header.rows
        self.snapshot_rows += header.rows
        if header.rows:
            stream.head = stream.next_position - 1
            batch.heads[stream.stream_id] = stream.head
            batch.head_ts[stream.stream_id] = header.at
        d._checkpoint = Checkpoint(lsn, max(header.rows, 1), True, d._flush_lsn)
        d._dirty = True

    def _publication(self, d: Decoder, message: pgo.Message) -> None:
        change = _publishable.decode_message(message.content)
        if change is None or change.publication != self.publication:
            return  # another capture's publication (or not ours at all)
        if d._stream_xid is None and d._skip_upto < 0:
            return  # a transaction an earlier run stored whole
        for state in change.removed:
            log.warning("table %s left publication %r (%s): its stream keeps the records "
                        "captured so far and gets no new ones until it is captured again",
                        state.qualified, self.publication, state.reason)
        for state in change.excluded:
            log.warning("%s", _publishable.not_captured_text(state, self.publication))
        for state in change.rejoined:
            log.info("table %s is back in publication %r within the same transaction, with no "
                     "change while it was out: nothing to re-read", state.qualified,
                     self.publication)
        if not change.added:
            return
        subxid = message.xid if message.xid is not None else d._xid
        joined: dict[int, tuple[int, str, str, str]] = {}
        for state in change.added:
            stream = f"{self.stream_prefix}{state.schema}.{state.table}"
            truncated = d.truncate_stream(stream, state.relid, subxid)
            joined[state.relid] = (state.relid, state.schema, state.table, stream)
            log.info("table %s joined publication %r: %sre-snapshotting it into stream %s",
                     state.qualified, self.publication,
                     "truncating and " if truncated else "", stream)
        if d._stream_xid is None:
            _action(d._batch, _PlanResnapshot, self.slot).tables.update(joined)
            d._dirty = True
        else:  # planned when (and if) the streamed transaction commits
            self._streamed_joins.setdefault(d._stream_xid, {}).update(joined)

    def _event_commit(self, d: Decoder, message: pgo.Message) -> None:
        try:
            xid = int(message.content)
        except ValueError:
            return  # somebody else's message under our prefix
        if d._stream_xid is None:
            _action(d._batch, _StoreEventCommits, self.slot).commits.append(
                (xid, d._final_lsn))
            d._dirty = True
        else:  # recorded when (and if) the streamed transaction commits
            self._streamed_markers.setdefault(d._stream_xid, set()).add(xid)

    def _heartbeat(self, d: Decoder, message: pgo.Message) -> None:
        try:
            doc = json.loads(message.content)
            slot, at = str(doc["slot"]), datetime.fromisoformat(doc["at"])
        except (ValueError, KeyError, TypeError):
            return  # somebody else's message under our prefix: not a heartbeat of ours
        if slot == self.slot:
            _action(d._batch, _StoreHeartbeats, self.slot).beats.append((message.lsn, at))
        if not d.in_transaction and not d._streamed:
            # Nothing of the capture is open before this point: confirm up to it.
            d._flush_lsn = max(d._flush_lsn, message.lsn)
        d._dirty = True

    # unchanged TOASTed values

    def unchanged_update(self, d: Decoder, rel: Any, subxid: int, old_key: bytes | None,
                         key: bytes, before: bytes | None, after: bytes) -> None:
        """Emit an update whose new image has unchanged TOASTed values (their indexes are in
        ``d._unchanged``): filled from a full old image, or noted for the store to fill."""
        indexes = list(d._unchanged)
        d._unchanged.clear()
        if before is not None and rel.schema.replica_identity == "f":
            after = fill_from_before(before, after, indexes)
            indexes = []
        changed_key = old_key is not None and old_key != key
        if changed_key and old_key is not None:
            d._emit(rel, _OP_DELETE, old_key, before if before is not None else NULL_FIELD,
                    NULL_FIELD, subxid)
        rows_before = len(d._batch.rows)
        d._emit(rel, _OP_INSERT if changed_key else _OP_UPDATE, key,
                NULL_FIELD if changed_key or before is None else before, after, subxid)
        if not indexes:
            return
        source = (old_key if changed_key and old_key is not None else key)[4:]
        columns = tuple(rel.schema.columns[i].name for i in indexes)
        stream_id = rel.stream.stream_id
        if d._stream_xid is None:
            if len(d._batch.rows) > rows_before:  # not skipped as already stored
                _action(d._batch, ToastFill, self.slot).items.append(FillItem(
                    stream_id, rel.stream.next_position - 1, source, tuple(indexes), columns))
            return
        txn = d._streamed[d._stream_xid]
        self._streamed_fills.setdefault(txn.xid, []).append(_StagedFill(
            txn.seq, stream_id, txn.stream_counts[stream_id], source, tuple(indexes), columns))

    def stream_committed(self, d: Decoder, txn: Any, *, commit_lsn: int, aborted: set[int],
                         skip: int, bases: dict[int, int]) -> None:
        """A streamed transaction committed: its staged fills get their final positions
        (numbered as ``ChangelogWriter._move_streamed`` numbers the moved rows)."""
        markers = self._streamed_markers.pop(txn.xid, None)
        if markers:
            _action(d._batch, _StoreEventCommits, self.slot).commits.extend(
                (xid, commit_lsn) for xid in sorted(markers))
        joined = self._streamed_joins.pop(txn.xid, None)
        if joined:
            _action(d._batch, _PlanResnapshot, self.slot).tables.update(joined)
        fills = self._streamed_fills.pop(txn.xid, None)
        if not fills:
            return
        action = _action(d._batch, ToastFill, self.slot)
        if not aborted and not skip:
            for f in fills:
                action.items.append(FillItem(f.stream_id, bases[f.stream_id] + f.stream_seq - 1,
                                             f.source_key, f.indexes, f.columns))
            return
        wanted = {f.seq: f for f in fills}
        ordinal = 0
        per_stream: dict[int, int] = {}
        for seq, (stream_id, subxid) in enumerate(zip(txn.streams, txn.subxids, strict=True),
                                                  start=1):
            if subxid in aborted:
                continue
            ordinal += 1
            if ordinal <= skip:
                continue
            per_stream[stream_id] = per_stream.get(stream_id, 0) + 1
            fill = wanted.get(seq)
            if fill is not None:
                action.items.append(FillItem(
                    stream_id, bases[stream_id] + per_stream[stream_id] - 1, fill.source_key,
                    fill.indexes, fill.columns))

    def stream_dropped(self, xid: int) -> None:
        """A streamed transaction aborted, or was stored by an earlier run."""
        self._streamed_fills.pop(xid, None)
        self._streamed_joins.pop(xid, None)
        self._streamed_markers.pop(xid, None)


def chunk_time(at: int) -> datetime:
    """A chunk header's time as a datetime."""
    return pgo.PG_EPOCH + timedelta(microseconds=at)
