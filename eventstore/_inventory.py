"""What the event store holds: its streams, categories and event types, for callers that check
names (a projection's sources) before reading, and for ``lakefold events streams``.

Both answers are read from indexes: categories from ``lakefold.streams``, types by a skip
scan over ``event_runs_type_idx`` (one probe per distinct type, not a pass over the events). A
database where the store is not installed holds nothing: both return ``[]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final

import psycopg

from lakefold.core.dsn import mask_dsn
from lakefold.eventstore._model import check_category
from lakefold.eventstore._translate import translate_errors

_INSTALLED: Final = "SELECT to_regclass('lakefold.events') IS NOT NULL"
_SUBSCRIPTIONS: Final = (
    "SELECT name, position, updated_at FROM lakefold.subscription_checkpoints ORDER BY name"
)
_CATEGORIES: Final = "SELECT DISTINCT category FROM lakefold.streams ORDER BY 1"
_TYPES: Final = (
    "WITH RECURSIVE t(type) AS ("
    " (SELECT type FROM lakefold.event_runs ORDER BY type LIMIT 1)"
    " UNION ALL SELECT (SELECT r.type FROM lakefold.event_runs r"
    "   WHERE r.type > t.type ORDER BY r.type LIMIT 1) FROM t WHERE t.type IS NOT NULL"
    ") SELECT t.type FROM t WHERE t.type IS NOT NULL"
    " AND (%(category)s::text IS NULL OR EXISTS (SELECT 1 FROM lakefold.event_runs r"
    "      WHERE r.type = t.type AND r.category = %(category)s::text))"
    " ORDER BY 1"
)


def _read(dsn: str, statement: str, params: dict[str, str | None]) -> list[str]:
    with translate_errors(mask_dsn(dsn)), psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(_INSTALLED).fetchone()
        if not (row and row[0]):
            return []
        return [str(r[0]) for r in conn.execute(statement, params).fetchall()]


def list_categories(dsn: str) -> list[str]:
    """The categories with at least one stream (deleted streams included), sorted."""
    return _read(dsn, _CATEGORIES, {})


def list_event_types(dsn: str, category: str | None = None) -> list[str]:
    """The event types stored anywhere, or in ``category`` only, sorted; deletion records
    (``$stream.deleted``) included when present."""
    category = None if category is None else check_category(category)
    return _read(dsn, _TYPES, {"category": category})


_STREAMS: Final = (
    "SELECT stream_id, category, version, deleted, updated_at FROM lakefold.streams "
    "WHERE (%(category)s::text IS NULL OR category = %(category)s::text) "
    "AND stream_id > %(after)s::text ORDER BY stream_id LIMIT %(limit)s")


@dataclass(frozen=True)
class StreamInfo:
    """One stream: its version (the number of events appended), and whether it was deleted."""

    stream_id: str
    category: str
    version: int
    deleted: str | None
    updated_at: datetime


def list_streams(dsn: str, category: str | None = None, *, after: str = "",
                 limit: int = 1000) -> list[StreamInfo]:
    """Up to ``limit`` streams in id order after ``after`` (for paging), optionally of one
    category; ``[]`` where the store is not installed."""
    category = None if category is None else check_category(category)
    with translate_errors(mask_dsn(dsn)), psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(_INSTALLED).fetchone()
        if not (row and row[0]):
            return []
        rows = conn.execute(_STREAMS, {"category": category, "after": after,
                                       "limit": limit}).fetchall()
    return [StreamInfo(str(r[0]), str(r[1]), int(r[2]), r[3], r[4]) for r in rows]


@dataclass(frozen=True)
class SubscriptionInfo:
    """A durable subscription: its name, the last position it saved, and when."""

    name: str
    position: int
    updated_at: datetime


def list_subscriptions(dsn: str) -> list[SubscriptionInfo]:
    """Every durable subscription's checkpoint, by name; ``[]`` where the store is not
    installed."""
    with translate_errors(mask_dsn(dsn)), psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(_INSTALLED).fetchone()
        if not (row and row[0]):
            return []
        rows = conn.execute(_SUBSCRIPTIONS).fetchall()
    return [SubscriptionInfo(str(r[0]), int(r[1]), r[2]) for r in rows]
