"""Bad snapshot, heartbeat and health options are refused with a message saying what to fix;
the in-band chunk format round-trips."""

from __future__ import annotations

from datetime import timedelta

import pytest

from lakefold.capture import (
    CaptureConfigurationError,
    HealthThresholds,
    HeartbeatPolicy,
    SnapshotPolicy,
)
from lakefold.capture.decoding._inband_messages import (
    ChunkHeader,
    decode_chunk_header,
    encode_chunk,
    encode_tuple,
)
from lakefold.capture.decoding._pgoutput import Relation, RelationColumn, read_tuple
from lakefold.capture.decoding._toast_fill import array_field, array_parts, fill_from_before
from lakefold.capture.exceptions import DecodingError


@pytest.mark.parametrize(("make", "message"), [
    (lambda: SnapshotPolicy(chunk_rows=0), "chunk_rows"),
    (lambda: SnapshotPolicy(incremental_chunk_rows=0), "incremental_chunk_rows"),
    (lambda: SnapshotPolicy(chunk_bytes=10), "chunk_bytes"),
    (lambda: SnapshotPolicy(workers=0), "workers"),
    (lambda: SnapshotPolicy(lock_retries=-1), "lock_retries"),
    (lambda: HeartbeatPolicy(interval=timedelta(0)), "interval"),
    (lambda: HeartbeatPolicy(keep=0), "keep"),
    (lambda: HealthThresholds(lag_bytes=(10, 5)), "lag_bytes"),
    (lambda: HealthThresholds(safe_wal_bytes=(1, 5)), "safe_wal_bytes"),
], ids=["chunk", "incremental", "bytes", "workers", "retries", "interval", "keep", "lag",
        "safe"])
def test_bad_options_are_refused(make, message: str) -> None:
    with pytest.raises(CaptureConfigurationError, match=message):
        make()


def test_chunk_messages_round_trip() -> None:
    relation = Relation(None, 42, "public", "t", "d", (
        RelationColumn(True, "id", 23, -1), RelationColumn(False, "note", 25, -1)))
    rows = [encode_tuple(["1", "a\tb"]), encode_tuple(["2", None])]
    content = encode_chunk(ChunkHeader("slot", 7, relation, 2, 123), rows)
    header, offset = decode_chunk_header(content)
    assert header.relation == relation and header.rows == 2 and header.snapshot_id == 7
    first, offset = read_tuple(content, offset)
    second, offset = read_tuple(content, offset)
    assert first == (b"1", b"a\tb") and second == (b"2", None) and offset == len(content)
    with pytest.raises(DecodingError, match="format marker"):
        decode_chunk_header(b"XXXX" + content[4:])


def test_fill_from_before_replaces_only_the_unchanged_values() -> None:
    def field(*values: bytes | None) -> bytes:
        return array_field([b"\xff\xff\xff\xff" if v is None else
                            len(v).to_bytes(4, "big") + v for v in values])

    before = field(b"1", b"old", b"big value")
    after = field(b"1", b"new", None)
    filled = fill_from_before(before, after, [2])
    assert array_parts(filled) == array_parts(field(b"1", b"new", b"big value"))
