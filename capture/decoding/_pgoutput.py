"""The pgoutput logical replication message format (protocol versions 1 and 2), decoded.

Reference: PostgreSQL manual, "Logical Replication Message Formats". Every message of protocol
version 1 (Begin, Commit, Origin, Relation, Type, Insert, Update, Delete, Truncate, Message)
and the streaming messages of version 2 (Stream Start, Stop, Commit, Abort) are parsed into
frozen dataclasses by ``parse_message``. Inside a stream block (between Stream Start and Stream
Stop) the data messages carry the transaction id right after the type byte; pass
``in_stream=True`` then.

The capture's hot path does not build these objects for every row: ``_decoder`` reads Insert,
Update and Delete in place with ``read_tuple``. The dataclasses are for the control messages,
for tests and for tools.

LSNs are plain ints here; ``format_lsn`` and ``parse_lsn`` convert to and from PostgreSQL's
``X/Y`` text form.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from lakefold.capture.exceptions import DecodingError

PG_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)
_PG_EPOCH_UNIX_US: Final = 946_684_800_000_000

# Tuple column kinds.
KIND_NULL: Final = 0x6E  # 'n'
KIND_UNCHANGED: Final = 0x75  # 'u': unchanged TOASTed value, not sent
KIND_TEXT: Final = 0x74  # 't'
KIND_BINARY: Final = 0x62  # 'b'

# Truncate options.
TRUNCATE_CASCADE: Final = 1
TRUNCATE_RESTART_IDENTITY: Final = 2

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_BEGIN = struct.Struct(">qqI")
_COMMIT = struct.Struct(">bqqq")
_STREAM_COMMIT = struct.Struct(">Ibqqq")


class Unchanged:
    """The placeholder for an unchanged TOASTed value that the server did not send."""

    _instance: Unchanged | None = None

    def __new__(cls) -> Unchanged:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = Unchanged()

TupleValue = bytes | None | Unchanged


def pg_timestamp(microseconds: int) -> datetime:
    """A PostgreSQL protocol timestamp (µs since 2000-01-01 UTC) as an aware datetime."""
    return PG_EPOCH + timedelta(microseconds=microseconds)


def pg_time(at: datetime) -> int:
    """An aware datetime as a PostgreSQL protocol timestamp (the inverse of ``pg_timestamp``)."""
    return (at - PG_EPOCH) // timedelta(microseconds=1)


def pg_now() -> int:
    """Now, as a PostgreSQL protocol timestamp."""
    return int(datetime.now(UTC).timestamp() * 1_000_000) - _PG_EPOCH_UNIX_US


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int
    commit_ts: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int


@dataclass(frozen=True, slots=True)
class Origin:
    commit_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    key: bool
    name: str
    type_oid: int
    type_modifier: int


@dataclass(frozen=True, slots=True)
class Relation:
    xid: int | None
    relid: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class Type:
    xid: int | None
    type_oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    xid: int | None
    relid: int
    new: tuple[TupleValue, ...]


@dataclass(frozen=True, slots=True)
class Update:
    xid: int | None
    relid: int
    old_kind: str | None  # 'K' (old key), 'O' (old tuple, REPLICA IDENTITY FULL) or None
    old: tuple[TupleValue, ...] | None
    new: tuple[TupleValue, ...]


@dataclass(frozen=True, slots=True)
class Delete:
    xid: int | None
    relid: int
    old_kind: str
    old: tuple[TupleValue, ...]


@dataclass(frozen=True, slots=True)
class Truncate:
    xid: int | None
    options: int
    relids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Message:
    xid: int | None
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    pass


@dataclass(frozen=True, slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    xid: int
    subxid: int


PgOutputMessage = (
    Begin | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate | Message
    | StreamStart | StreamStop | StreamCommit | StreamAbort
)


def read_cstring(data: bytes | memoryview, offset: int) -> tuple[str, int]:
    """A NUL-terminated UTF-8 string at ``offset``; returns it and the offset after the NUL."""
    raw = bytes(data[offset:]) if isinstance(data, memoryview) else data
    base = 0 if isinstance(data, memoryview) else offset
    end = raw.find(b"\x00", base)
    if end < 0:
        raise DecodingError("pgoutput string without terminator; the stream is corrupt")
    return raw[base:end].decode(), offset + (end - base) + 1


def read_tuple(data: bytes | memoryview, offset: int) -> tuple[tuple[TupleValue, ...], int]:
    """A TupleData at ``offset``: values as raw text bytes, None for NULL, UNCHANGED_TOAST
    for an unchanged TOASTed value. Returns the values and the offset after the tuple."""
    (count,) = _I16.unpack_from(data, offset)
    offset += 2
    values: list[TupleValue] = []
    for _ in range(count):
        kind = data[offset]
        offset += 1
        if kind == KIND_TEXT or kind == KIND_BINARY:
            (length,) = _I32.unpack_from(data, offset)
            offset += 4
            values.append(bytes(data[offset:offset + length]))
            offset += length
        elif kind == KIND_NULL:
            values.append(None)
        elif kind == KIND_UNCHANGED:
            values.append(UNCHANGED_TOAST)
        else:
            raise DecodingError(f"unknown tuple column kind {kind!r} in pgoutput data")
    return tuple(values), offset


def _xid(data: bytes | memoryview, offset: int, in_stream: bool) -> tuple[int | None, int]:
    if not in_stream:
        return None, offset
    return _U32.unpack_from(data, offset)[0], offset + 4


def parse_message(data: bytes | memoryview, *, in_stream: bool = False) -> PgOutputMessage:
    """Decode one pgoutput message (the payload of an XLogData message).

    Raises DecodingError for an unknown message type or a truncated message.
    """
    try:
        return _parse(data, in_stream)
    except (struct.error, IndexError, UnicodeDecodeError) as e:
        raise DecodingError(f"malformed pgoutput message of type {chr(data[0])!r}: {e}") from e


def _parse(data: bytes | memoryview, in_stream: bool) -> PgOutputMessage:
    kind = chr(data[0])
    if kind == "B":
        final_lsn, commit_ts, xid = _BEGIN.unpack_from(data, 1)
        return Begin(final_lsn, commit_ts, xid)
    if kind == "C":
        return Commit(*_COMMIT.unpack_from(data, 1))
    if kind == "O":
        (lsn,) = _I64.unpack_from(data, 1)
        name, _ = read_cstring(data, 9)
        return Origin(lsn, name)
    if kind == "R":
        return _parse_relation(data, in_stream)
    if kind == "Y":
        xid, off = _xid(data, 1, in_stream)
        (oid,) = _U32.unpack_from(data, off)
        namespace, off = read_cstring(data, off + 4)
        name, _ = read_cstring(data, off)
        return Type(xid, oid, namespace, name)
    if kind == "I":
        xid, off = _xid(data, 1, in_stream)
        (relid,) = _U32.unpack_from(data, off)
        if data[off + 4] != 0x4E:  # 'N'
            raise DecodingError("Insert message without a new tuple")
        new, _ = read_tuple(data, off + 5)
        return Insert(xid, relid, new)
    if kind == "U":
        return _parse_update(data, in_stream)
    if kind == "D":
        xid, off = _xid(data, 1, in_stream)
        (relid,) = _U32.unpack_from(data, off)
        old_kind = chr(data[off + 4])
        old, _ = read_tuple(data, off + 5)
        return Delete(xid, relid, old_kind, old)
    if kind == "T":
        xid, off = _xid(data, 1, in_stream)
        (count,) = _I32.unpack_from(data, off)
        options = data[off + 4]
        relids = struct.unpack_from(f">{count}I", data, off + 5)
        return Truncate(xid, options, tuple(relids))
    if kind == "M":
        xid, off = _xid(data, 1, in_stream)
        flags = data[off]
        (lsn,) = _I64.unpack_from(data, off + 1)
        prefix, off = read_cstring(data, off + 9)
        (length,) = _I32.unpack_from(data, off)
        return Message(xid, bool(flags & 1), lsn, prefix, bytes(data[off + 4:off + 4 + length]))
    if kind == "S":
        (xid,) = _U32.unpack_from(data, 1)
        return StreamStart(xid, data[5] == 1)
    if kind == "E":
        return StreamStop()
    if kind == "c":
        return StreamCommit(*_STREAM_COMMIT.unpack_from(data, 1))
    if kind == "A":
        xid, subxid = struct.unpack_from(">II", data, 1)
        return StreamAbort(xid, subxid)
    raise DecodingError(
        f"unknown pgoutput message type {kind!r}; this capture speaks protocol versions 1 "
        "and 2 (streaming); two-phase and parallel streaming are not requested"
    )


def _parse_relation(data: bytes | memoryview, in_stream: bool) -> Relation:
    xid, off = _xid(data, 1, in_stream)
    (relid,) = _U32.unpack_from(data, off)
    namespace, off = read_cstring(data, off + 4)
    name, off = read_cstring(data, off)
    identity = chr(data[off])
    (count,) = _I16.unpack_from(data, off + 1)
    off += 3
    columns = []
    for _ in range(count):
        flags = data[off]
        column, off = read_cstring(data, off + 1)
        type_oid, typmod = struct.unpack_from(">Ii", data, off)
        off += 8
        columns.append(RelationColumn(bool(flags & 1), column, type_oid, typmod))
    return Relation(xid, relid, namespace or "pg_catalog", name, identity, tuple(columns))


def _parse_update(data: bytes | memoryview, in_stream: bool) -> Update:
    xid, off = _xid(data, 1, in_stream)
    (relid,) = _U32.unpack_from(data, off)
    off += 4
    marker = chr(data[off])
    old_kind: str | None = None
    old: tuple[TupleValue, ...] | None = None
    if marker in ("K", "O"):
        old_kind = marker
        old, off = read_tuple(data, off + 1)
        marker = chr(data[off])
    if marker != "N":
        raise DecodingError(f"Update message with unexpected marker {marker!r}")
    new, _ = read_tuple(data, off + 1)
    return Update(xid, relid, old_kind, old, new)
