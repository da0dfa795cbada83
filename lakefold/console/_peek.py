"""Look inside: the latest records of a changelog stream or of an event category (newest
first, paged by ``before`` a position, each with its schema version), one dead letter with its
record and error, and a view's rows for one key (read from its target: Delta or Redis).

Values become JSON here: times as ISO text, decimals as text (no float rounding), bytes as
hex.
"""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lakefold.capture import ChangelogStore, UnknownStreamError
from lakefold.console.exceptions import ConsoleNotFoundError, ConsoleRequestError
from lakefold.eventstore import EventStore, StoreOptions, list_categories
from lakefold.projections import DeadLetters, RedisCacheReader
from lakefold.projections.operations import Catalog

_FIRST_WINDOW = 256


def json_safe(value: Any) -> Any:
    """``value`` with every leaf a JSON type."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, float) and value != value:  # NaN has no JSON
        return None
    return value


def _newest_first(read: Callable[[int, int], list[dict[str, Any]]], position_of: str,
                  before: int, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` items with position < ``before``, newest first: ``read(start, end)``
    gives the items in ``[start, end)``, oldest first; the window widens until enough are
    found or position 1 is reached (compaction and deletions leave holes)."""
    window = max(_FIRST_WINDOW, limit)
    found: list[dict[str, Any]] = []
    end = before
    while end > 1 and len(found) < limit:
        start = max(1, end - window)
        part = [r for r in read(start, end) if start <= r[position_of] < end]
        found = sorted(part, key=lambda r: r[position_of], reverse=True) + found
        found.sort(key=lambda r: r[position_of], reverse=True)
        end = start
        window *= 4
    return found[:limit]


def stream_records(store_dsn: str, stream: str, *, before: int | None,
                   limit: int) -> dict[str, Any]:
    """The latest records of a changelog stream, newest first, before a position."""
    with ChangelogStore(store_dsn) as store:
        try:
            info = store.stream(stream)
        except UnknownStreamError as e:
            raise ConsoleNotFoundError(f"no changelog stream named {stream!r}; "
                                       "GET /api/streams lists them") from e

        def read(start: int, end: int) -> list[dict[str, Any]]:
            return list(store.read(stream, start, limit=end - start).to_pylist())

        top = info.head + 1 if before is None else min(before, info.head + 1)
        records = _newest_first(read, "_position", top, limit)
    return {"stream": stream, "head": info.head, "schema_version": info.schema_version,
            "records": [json_safe(r) for r in records],
            "next_before": records[-1]["_position"] if len(records) == limit else None}


def category_events(store_dsn: str, category: str, *, before: int | None,
                    limit: int) -> dict[str, Any]:
    """The latest events of a category, newest first, before a global position."""
    if category not in list_categories(store_dsn):
        raise ConsoleNotFoundError(f"no event category named {category!r}; "
                                   "GET /api/categories lists them")
    options = StoreOptions(pool_size=1, application_name="lakefold-console")
    with EventStore(store_dsn, options=options) as store:
        head = store.head()

        def read(start: int, end: int) -> list[dict[str, Any]]:
            return [{"position": e.position, "stream_id": e.stream_id,
                     "stream_version": e.stream_version, "type": e.type,
                     "schema_version": e.schema_version, "event_id": str(e.event_id),
                     "recorded_at": e.recorded_at, "data": e.data}
                    for e in store.read_category(category, from_position=start,
                                                 to_position=end, limit=end - start)
                    if e.position is not None]

        top = head + 1 if before is None else min(before, head + 1)
        events = _newest_first(read, "position", top, limit)
    return {"category": category, "head": head, "events": [json_safe(e) for e in events],
            "next_before": events[-1]["position"] if len(events) == limit else None}


def dead_letter(catalog: Catalog, letter_id: int) -> dict[str, Any]:
    """One dead letter: its record, error, attempts and status."""
    letter = DeadLetters(catalog).get(letter_id)
    if letter is not None:
        return dict(json_safe(letter.as_json()))
    raise ConsoleNotFoundError(f"no dead letter with id {letter_id}; "
                               "GET /api/dead-letters lists them")


def view_rows(catalog: Catalog, name: str, key: list[str], *,
              redis_url: str | None) -> dict[str, Any]:
    """The rows of a view (or projection) for one key, read from its current generation's
    target: a Delta table (rows whose key columns equal ``key``) or a Redis cache."""
    row = catalog.projection(name)  # ProjectionNotFoundError: 404
    definition = catalog.definition(name) or {}
    generation = catalog.current(name)
    target = definition.get("target", {})
    columns = list(definition.get("key") or target.get("keys") or [target.get("key")])
    columns = [c for c in columns if c]
    if row.target_kind == "redis":
        if redis_url is None:
            raise ConsoleRequestError(f"{name} is a Redis cache and no Redis URL is set; "
                                      "set LAKEFOLD_REDIS_URL")
        with RedisCacheReader(redis_url) as reader:
            value = reader.get(name, key[0] if len(key) == 1 else key)
        rows = [] if value is None else [value]
    elif row.target_kind == "delta":
        rows = _delta_rows(generation.location("delta"), columns, key)
    else:
        raise ConsoleRequestError(f"{name} writes to {row.target_kind}; rows by key are read "
                                  "from Delta and Redis targets (search it with "
                                  "`lakefold search`)")
    return {"name": name, "generation": generation.generation, "key_columns": columns,
            "key": key, "rows": [json_safe(r) for r in rows]}


def _delta_rows(path: str, columns: list[str], key: list[str]) -> list[dict[str, Any]]:
    import polars as pl

    if len(columns) != len(key):
        raise ConsoleRequestError(f"the key has {len(columns)} column(s) ({', '.join(columns)})"
                                  f"; give {len(columns)} value(s), not {len(key)}")
    local = path.removeprefix("file://")
    if "://" not in local and not (Path(local) / "_delta_log").is_dir():
        return []  # the view has written nothing yet: no table, no rows
    try:
        frame = pl.scan_delta(path)
        schema = frame.collect_schema()
        predicate = pl.lit(True)
        for column, text in zip(columns, key, strict=True):
            predicate = predicate & (pl.col(column).cast(pl.String) == text) \
                if column in schema else pl.lit(False)
        return list(frame.filter(predicate).collect().to_dicts())
    except FileNotFoundError:  # removed under us (a rebuild's switch dropped it)
        return []
    except Exception as e:
        if "not a Delta table" in str(e) or "No such file" in str(e):
            return []
        raise ConsoleRequestError(f"cannot read the Delta table of this view ({e})") from e
