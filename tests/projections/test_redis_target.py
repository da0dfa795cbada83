"""The Redis cache target: exactly-once batches, the position guard, deletes, the reader."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pytest
import redis

from lakefold.projections.exceptions import ProjectionNotFoundError, TargetError
from lakefold.projections.targets._redis import (
    RedisCacheReader,
    RedisCacheWriter,
    drop_prefix,
)

pytestmark = pytest.mark.timeout(60)


def rows(*items: dict[str, object]) -> pa.Table:
    return pa.Table.from_pylist(list(items))


def test_hash_values_positions_and_reader(redis_url):
    writer = RedisCacheWriter(redis_url, "lf:c:g1:", key="id")
    result = writer.write(rows({"id": 1, "name": "Ann", "amount": Decimal("1.50"), "city": None,
                                "_position": 5}), batch_id=0, position=0)
    assert (result.written, result.refused) == (1, 0)
    writer.publish("c", "lf", 1)
    with RedisCacheReader(redis_url) as reader:
        assert reader.get("c", 1) == {"id": "1", "name": "Ann", "amount": "1.50"}
        assert reader.position("c", 1) == 5
        assert reader.get("c", 2) is None
        assert reader.keys("c") == ["1"]
        with pytest.raises(ProjectionNotFoundError, match="no Redis cache view named 'x'"):
            reader.get("x", 1)
    writer.close()


def test_replayed_batch_is_a_no_op(redis_url):
    writer = RedisCacheWriter(redis_url, "lf:c:g1:", key="id", format="json")
    writer.write(rows({"id": "a", "v": 1}), batch_id=3, position=10)
    # a newer batch changes the key, then the old batch is replayed (a crash replay)
    writer.write(rows({"id": "a", "v": 2}), batch_id=4, position=11)
    replay = writer.write(rows({"id": "a", "v": 1}), batch_id=3, position=10)
    assert replay.skipped_chunks == 1 and replay.written == 0
    writer.publish("c", "lf", 1)
    with RedisCacheReader(redis_url) as reader:
        assert reader.get("c", "a") == {"id": "a", "v": 2}
    assert writer.checkpoint() == (4, 0)


def test_guard_refuses_to_move_a_key_backwards(redis_url):
    writer = RedisCacheWriter(redis_url, "lf:c:g1:", key="id")
    other = RedisCacheWriter(redis_url, "lf:c:g1:", key="id")  # e.g. a zombie process
    writer.write(rows({"id": 1, "v": "new", "_position": 20}), batch_id=7, position=0)
    result = other.write(rows({"id": 1, "v": "old", "_position": 12},
                              {"id": 2, "v": "fresh", "_position": 12}), batch_id=8, position=0)
    assert (result.written, result.refused) == (1, 1)
    writer.publish("c", "lf", 1)
    with RedisCacheReader(redis_url) as reader:
        assert reader.get("c", 1) == {"id": "1", "v": "new"}
        assert reader.get("c", 2) == {"id": "2", "v": "fresh"}


def test_delete_leaves_a_tombstone_position(redis_url):
    writer = RedisCacheWriter(redis_url, "lf:c:g1:", key="id")
    writer.write(rows({"id": 1, "v": "x", "_deleted": False}), batch_id=0, position=3)
    writer.write(rows({"id": 1, "v": None, "_deleted": True}), batch_id=1, position=9)
    # an older write for the deleted key, from another writer, must not resurrect it
    writer.write(rows({"id": 1, "v": "x", "_deleted": False}), batch_id=2, position=4)
    writer.publish("c", "lf", 1)
    with RedisCacheReader(redis_url) as reader:
        assert reader.get("c", 1) is None
        assert reader.position("c", 1) == 9


def test_big_batches_are_chunked_and_replays_skip_every_chunk(redis_url):
    writer = RedisCacheWriter(redis_url, "lf:c:g1:", key="id")
    table = rows(*({"id": i, "v": str(i)} for i in range(5_000)))
    first = writer.write(table, batch_id=0, position=1)
    assert first.written == 5_000
    again = writer.write(table, batch_id=0, position=1)
    assert again.skipped_chunks == 3 and again.written == 0


def test_bad_rows_are_rejected_not_written(redis_url):
    writer = RedisCacheWriter(redis_url, "lf:c:g1:", key="id")
    rejected: list[tuple[dict[str, object], str]] = []
    result = writer.write(rows({"id": None, "v": "a"}, {"id": 2, "v": "b"}), batch_id=0,
                          position=1, rejected=rejected)
    assert result.written == 1 and len(rejected) == 1 and "null key" in rejected[0][1]
    with pytest.raises(TargetError, match="null key"):
        writer.write(rows({"id": None, "v": "a"}), batch_id=1, position=2)


def test_drop_prefix_removes_one_generation_only(redis_url):
    for prefix in ("lf:c:g1:", "lf:c:g2:"):
        RedisCacheWriter(redis_url, prefix, key="id").write(
            rows({"id": 1, "v": "a"}), batch_id=0, position=1)
    assert drop_prefix(redis_url, "lf:c:g1:") == 3  # value, positions, checkpoint
    client = redis.Redis.from_url(redis_url)
    assert sorted(k.decode() if isinstance(k, bytes) else k for k in client.keys("*")) == [
        "lf:c:g2:_ckpt", "lf:c:g2:_pos", "lf:c:g2:k:1"]
    client.close()
