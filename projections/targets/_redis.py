"""The Redis cache target and its reader.

Layout of one generation (prefix ``lf:NAME:gN:``):

- ``<prefix>k:<key>``: the value of one key, a hash of the row's columns or a JSON string;
- ``<prefix>_pos``: a hash key → the source position the key's value reflects (kept after a
  delete, as a tombstone, so a replayed older write cannot resurrect a deleted key);
- ``<prefix>_ckpt``: the last applied (batch id, chunk);
- ``lf:NAME:current``: JSON pointer to the current generation, mirrored from the catalog for
  readers.

Exactly-once effect: a batch is applied in chunks, each by one Lua script that (1) skips the
chunk if the checkpoint is at or past it, (2) writes, or deletes, each key unless its stored
position is newer than the write's, and (3) stores the checkpoint, all atomically (Redis runs a
script without interleaving). A replay after a crash is therefore a no-op, and no key ever moves
backwards, even under a zombie writer.

A truncate of the source (``truncated_at``: its position) first deletes every key whose stored
position is at or below it (the rows written before it; the batch's own rows come after it),
leaving the truncate's position as each key's tombstone: a replay deletes nothing newer, and
no older write comes back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import redis

from lakefold.core.dsn import mask_dsn
from lakefold.projections.definitions._codec import _json_default, _scalar, key_text
from lakefold.projections.definitions._model import DELETED_COLUMN, POSITION_COLUMN
from lakefold.projections.definitions._targets import (
    GenerationTarget,
    Rejected,
    TargetBatch,
    TargetContext,
)
from lakefold.projections.exceptions import (
    ProjectionNotFoundError,
    ProjectionStateError,
    TargetError,
    TargetUnavailableError,
)
from lakefold.projections.state._catalog import redis_pointer_key

if TYPE_CHECKING:
    from lakefold.projections.definitions._target_specs import RedisCacheTarget

CHUNK_KEYS = 2_000
_APPLY = """
local ckpt, poskey, prefix = KEYS[1], KEYS[2], ARGV[1]
local batch, chunk = tonumber(ARGV[2]), tonumber(ARGV[3])
local last = redis.call('HMGET', ckpt, 'batch', 'chunk')
if last[1] then
  local lb, lc = tonumber(last[1]), tonumber(last[2])
  if batch < lb or (batch == lb and chunk <= lc) then return {-1, 0} end
end
local written, refused = 0, 0
local i = 4
while i <= #ARGV do
  local key, pos, op, n = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], tonumber(ARGV[i + 3])
  local current = redis.call('HGET', poskey, key)
  if current and tonumber(current) > pos then
    refused = refused + 1
  else
    local full = prefix .. 'k:' .. key
    if op == 'd' then
      redis.call('DEL', full)
    elseif op == 'h' then
      redis.call('DEL', full)
      if n > 0 then redis.call('HSET', full, unpack(ARGV, i + 4, i + 3 + n)) end
    else
      redis.call('SET', full, ARGV[i + 4])
    end
    redis.call('HSET', poskey, key, ARGV[i + 1])
    written = written + 1
  end
  i = i + 4 + n
end
redis.call('HSET', ckpt, 'batch', batch, 'chunk', chunk)
return {written, refused}
"""
_WIPE = """
local poskey, prefix, upto = KEYS[1], ARGV[1], tonumber(ARGV[2])
local deleted = 0
for i = 3, #ARGV do
  local current = redis.call('HGET', poskey, ARGV[i])
  if current and tonumber(current) <= upto then
    deleted = deleted + redis.call('DEL', prefix .. 'k:' .. ARGV[i])
    redis.call('HSET', poskey, ARGV[i], ARGV[2])
  end
end
return deleted
"""


@dataclass(frozen=True)
class RedisWriteResult:
    """What one batch did: keys written, writes refused as older than the stored value, and
    chunks skipped because the checkpoint showed them already applied."""

    written: int
    refused: int
    skipped_chunks: int


class RedisCacheWriter:
    """Writes batches of rows into one generation's key prefix, exactly once per batch."""

    def __init__(self, url: str, prefix: str, *, key: str,
                 format: Literal["hash", "json"] = "hash", checkpoint: str = "_ckpt",
                 null_keys: bool = False) -> None:
        """``checkpoint`` names the batch checkpoint (a targeted rebuild keeps its own, so
        the live batch sequence is untouched); ``null_keys``: a NULL key is a key
        (``NULL_KEY``), not a bad row."""
        self.null_keys = null_keys
        self._url = url
        self.prefix = prefix
        self._checkpoint = prefix + checkpoint
        self.key = key
        self.format = format
        self._client = redis.Redis.from_url(url)
        self._script = self._client.register_script(_APPLY)
        self._wipe = self._client.register_script(_WIPE)

    def close(self) -> None:
        self._client.close()

    def checkpoint(self) -> tuple[int, int] | None:
        """The last applied (batch id, chunk), or None for a fresh generation."""
        try:
            raw = self._client.hmget(self._checkpoint, ["batch", "chunk"])
        except redis.RedisError as e:
            raise TargetUnavailableError(f"Redis at {mask_dsn(self._url)}: {e}") from e
        if raw[0] is None or raw[1] is None:
            return None
        return int(raw[0]), int(raw[1])

    def encode(self, row: Mapping[str, Any], position: int) -> list[str | int]:
        """The script arguments for one row: key, position, op, field count, fields."""
        key = key_text(row.get(self.key), nulls=self.null_keys)
        if row.get(DELETED_COLUMN):
            return [key, position, "d", 0]
        values = {c: v for c, v in row.items()
                  if c not in (DELETED_COLUMN, POSITION_COLUMN) and v is not None}
        if self.format == "json":
            return [key, position, "j", 1,
                    json.dumps(values, default=_json_default, sort_keys=True)]
        fields: list[str | int] = []
        for column, value in values.items():
            fields += [column, _scalar(value)]
        return [key, position, "h", len(fields), *fields]

    def truncate(self, position: int) -> int:
        """Delete every key whose stored position is at or below ``position`` (a truncate of
        the source there), leaving ``position`` as its tombstone; returns how many values
        went. Idempotent, in chunks: a crash part way is finished by the replay."""
        poskey = self.prefix + "_pos"
        deleted = 0
        try:
            keys = [k for k, p in self._client.hscan_iter(poskey, count=CHUNK_KEYS)
                    if int(p) <= position]
            for i in range(0, len(keys), CHUNK_KEYS):
                deleted += int(self._wipe(keys=[poskey],
                                          args=[self.prefix, position, *keys[i:i + CHUNK_KEYS]]))
        except redis.ConnectionError as e:
            raise TargetUnavailableError(
                f"Redis at {mask_dsn(self._url)} is unreachable ({e}); retrying"
            ) from e
        except redis.RedisError as e:
            raise TargetError(f"Redis refused a truncate at position {position}: {e}") from e
        return deleted

    def write(self, rows: pa.Table, *, batch_id: int, position: int,
              rejected: list[tuple[dict[str, Any], str]] | None = None,
              truncated_at: int | None = None) -> RedisWriteResult:
        """Apply ``rows`` as batch ``batch_id``. Rows without a ``_position`` column carry
        ``position`` (the batch's source position). Rows that cannot be encoded are appended
        to ``rejected`` with their error (the caller dead-letters them) instead of failing
        the batch; with ``rejected=None`` they raise TargetError. ``truncated_at``: the
        source was truncated at that position before these rows (``truncate`` runs first)."""
        if truncated_at is not None:
            self.truncate(truncated_at)
        encoded: list[tuple[str, list[str | int]]] = []
        has_position = POSITION_COLUMN in rows.column_names
        if has_position and rows.num_rows > 1:  # several rows of a key: oldest first
            rows = rows.sort_by([(POSITION_COLUMN, "ascending")])
        for row in _rows(rows):
            row_position = int(row[POSITION_COLUMN]) if has_position and \
                row.get(POSITION_COLUMN) is not None else position
            try:
                args = self.encode(row, row_position)
            except (TargetError, TypeError, ValueError) as e:
                if rejected is None:
                    raise TargetError(f"cannot write row {row!r} to Redis: {e}") from e
                rejected.append((row, str(e)))
                continue
            encoded.append((str(args[0]), args))
        # Deterministic chunks (sorted by key) so that a replay skips exactly what was applied.
        encoded.sort(key=lambda item: item[0])
        written = refused = skipped = 0
        chunks = [encoded[i:i + CHUNK_KEYS] for i in range(0, len(encoded), CHUNK_KEYS)] or [[]]
        for number, chunk in enumerate(chunks):
            argv: list[str | int] = [self.prefix, batch_id, number]
            for _, args in chunk:
                argv.extend(args)
            try:
                result = self._script(keys=[self._checkpoint, self.prefix + "_pos"],
                                      args=argv)
            except redis.ConnectionError as e:
                raise TargetUnavailableError(
                    f"Redis at {mask_dsn(self._url)} is unreachable ({e}); retrying"
                ) from e
            except redis.RedisError as e:
                raise TargetError(f"Redis refused batch {batch_id}: {e}") from e
            if int(result[0]) < 0:
                skipped += 1
            else:
                written += int(result[0])
                refused += int(result[1])
        return RedisWriteResult(written=written, refused=refused, skipped_chunks=skipped)

    def publish(self, name: str, namespace: str, generation: int) -> None:
        """Point readers at this generation (after the catalog switched to it)."""
        pointer = {"generation": generation, "prefix": self.prefix, "format": self.format}
        self._client.set(redis_pointer_key(namespace, name), json.dumps(pointer))


def read_value(client: redis.Redis, prefix: str, format: str, key: object
               ) -> dict[str, Any] | None:
    """The value of ``key`` under a generation's ``prefix`` (a client that decodes
    responses), or None when the key is absent."""
    full = f"{prefix}k:{key_text(key, nulls=True)}"
    if format == "json":
        raw = client.get(full)
        return None if raw is None else dict(json.loads(raw))
    value: dict[str, Any] = client.hgetall(full)  # type: ignore[assignment]
    return dict(value) if value else None


def _rows(table: pa.Table) -> Iterator[dict[str, Any]]:
    for batch in table.to_batches(max_chunksize=10_000):
        yield from batch.to_pylist()


def drop_prefix(url: str, prefix: str) -> int:
    """Delete every key of a generation (used after a switch); returns how many."""
    client = redis.Redis.from_url(url)
    try:
        removed = 0
        batch: list[bytes] = []
        for key in client.scan_iter(match=prefix + "*", count=1_000):
            batch.append(key)
            if len(batch) >= 1_000:
                removed += int(client.unlink(*batch))
                batch = []
        if batch:
            removed += int(client.unlink(*batch))
        return removed
    finally:
        client.close()


class RedisCacheReader:
    """Reads a cache view by NAME, resolving its current generation through the pointer that
    the runner mirrors from the catalog. ``get`` never sees a half-built generation: the
    pointer only ever names a generation after it was completely built and switched to."""

    def __init__(self, url: str, *, namespace: str = "lf", pointer_ttl: float = 0.5) -> None:
        self._url = url
        self._namespace = namespace
        self._client = redis.Redis.from_url(url, decode_responses=True)
        self._pointer_ttl = pointer_ttl
        self._pointers: dict[str, tuple[float, dict[str, Any]]] = {}

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RedisCacheReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pointer(self, view: str) -> dict[str, Any]:
        """The current generation of ``view``: ``{"generation", "prefix", "format"}``."""
        cached = self._pointers.get(view)
        now = time.monotonic()
        if cached is not None and now - cached[0] < self._pointer_ttl:
            return cached[1]
        raw = self._client.get(redis_pointer_key(self._namespace, view))
        if raw is None:
            raise ProjectionNotFoundError(
                f"no Redis cache view named {view!r}; is a projection with a redis_cache target "
                "of that name running (`lakefold status`)?"
            )
        pointer: dict[str, Any] = json.loads(raw)
        self._pointers[view] = (now, pointer)
        return pointer

    def get(self, view: str, key: object) -> dict[str, Any] | None:
        """The value of ``key`` in ``view`` (a dict), or None when the key is absent."""
        pointer = self.pointer(view)
        return read_value(self._client, pointer["prefix"], pointer["format"], key)

    def position(self, view: str, key: object) -> int | None:
        """The source position the stored value of ``key`` reflects."""
        pointer = self.pointer(view)
        raw = self._client.hget(pointer["prefix"] + "_pos", key_text(key, nulls=True))
        return None if raw is None else int(raw)

    def keys(self, view: str) -> Iterable[str]:
        """Every key present in ``view`` (a scan; for tests and small views)."""
        pointer = self.pointer(view)
        start = len(pointer["prefix"]) + 2
        return sorted(k[start:] for k in self._client.scan_iter(
            match=pointer["prefix"] + "k:*", count=1_000))


class RedisGenerationTarget(GenerationTarget):
    """One generation's key prefix, as the ``Target`` protocol sees it (``_targets``): a
    batch is applied by ``RedisCacheWriter``'s Lua chunks, each guarded by the checkpoint and
    the keys' positions and storing the checkpoint."""

    kind = "redis"

    def __init__(self, spec: RedisCacheTarget, location: str, context: TargetContext) -> None:
        super().__init__(location, context)
        if context.redis_url is None:
            raise ProjectionStateError(
                f"projection {context.projection} writes to Redis, but no Redis URL is "
                "configured; set LAKEFOLD_REDIS_URL"
            )
        self.spec = spec
        self.url = context.redis_url
        self.writer = RedisCacheWriter(self.url, location, key=spec.key, format=spec.format,
                                       null_keys=context.null_keys)
        self._reader: redis.Redis | None = None

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.spec.key,)

    def write(self, rows: pa.Table, batch: TargetBatch, *,
              rejected: Rejected | None = None) -> bool:
        result = self.writer.write(
            rows, batch_id=batch.batch_id, position=batch.position, rejected=rejected,
            truncated_at=batch.truncates[-1].position if batch.truncates else None)
        return not (result.skipped_chunks and not result.written and not result.refused)

    def _client(self) -> redis.Redis:
        if self._reader is None:
            self._reader = redis.Redis.from_url(self.url, decode_responses=True)
        return self._reader

    def read(self, keys: Sequence[object]) -> dict[str, dict[str, Any]]:
        found = {}
        for key in keys:
            value = read_value(self._client(), self.location, self.spec.format, key)
            if value is not None:
                found[key_text(key, nulls=True)] = value
        return found

    def stored_keys(self) -> list[object]:
        start = len(self.location) + 2
        return [k[start:] for k in self._client().scan_iter(match=self.location + "k:*")]

    def checkpoint(self) -> int | None:
        last = self.writer.checkpoint()
        return None if last is None else last[0]

    def repair(self, rows: pa.Table, position: int) -> None:
        """Through the position guard, under a checkpoint of its own (``_ckpt_part``): the
        batch sequence's checkpoint stays where it is, and no key moves backwards."""
        writer = RedisCacheWriter(self.url, self.location, key=self.spec.key,
                                  format=self.spec.format, checkpoint="_ckpt_part")
        try:
            writer.write(rows, batch_id=int(time.time() * 1000), position=position)
        finally:
            writer.close()

    def publish(self) -> None:
        self.writer.publish(self.context.projection, self.context.redis_namespace,
                            self.context.generation)

    def close(self) -> None:
        self.writer.close()
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    @classmethod
    def drop_storage(cls, location: str, context: TargetContext) -> None:
        if context.redis_url is not None:
            drop_prefix(context.redis_url, location)
