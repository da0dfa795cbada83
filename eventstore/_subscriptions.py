"""Subscriptions: catch up from a position, then follow the log live.

A subscription reads the global log (optionally one category and/or some event types) in
position order, in batches, starting after its checkpoint (durable subscriptions) or after a
given position (ephemeral ones, e.g. ``lakefold events tail``). When it has caught up with the
head it waits for the sequencer's NOTIFY, and polls every ``poll_interval_s`` as a fallback
(writers in processes without a background sequencer, a missed notification, a watermark held
by a foreign transaction).

Delivery is at least once: the checkpoint is only moved by the consumer
(``Subscription.save_checkpoint``, or ``save_checkpoint(conn, name, position)`` inside the
consumer's own PostgreSQL transaction, so its writes and the checkpoint commit together).
After a restart the subscription resumes after the saved checkpoint, so events processed but
not yet checkpointed are delivered again. Within one run each event is delivered once, in
position order. Transient errors (a restarted server) are retried every ``retry_interval_s``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from lakefold.eventstore._model import (
    LogQuery,
    check_category,
    check_limit,
    check_types,
    finite_seconds,
)
from lakefold.eventstore._recorder import EventRecorder, Waiter
from lakefold.eventstore.exceptions import EventStoreTerminalError, EventStoreUnavailableError
from lakefold.schemas.events import EventEnvelope

logger = logging.getLogger(__name__)

_STOP_QUANTUM_S = 0.2  # how often a waiting subscription checks whether it was stopped


@dataclass(frozen=True, slots=True)
class SubscriptionOptions:
    """What a subscription reads and how it waits.

    ``category``/``types`` filter the log (deletion records always pass a type filter);
    ``batch_size`` bounds each delivered batch; ``include_deleted`` also delivers events of
    soft-deleted streams (for replays that must see everything)."""

    category: str | None = None
    types: tuple[str, ...] | None = None
    batch_size: int = 1000
    include_deleted: bool = False
    poll_interval_s: float = 1.0
    retry_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if self.category is not None:
            object.__setattr__(self, "category", check_category(self.category))
        object.__setattr__(self, "types", check_types(self.types))
        check_limit(self.batch_size)
        finite_seconds(self.poll_interval_s, "poll_interval_s")
        finite_seconds(self.retry_interval_s, "retry_interval_s")
        if self.poll_interval_s <= 0:
            raise EventStoreTerminalError("poll_interval_s must be > 0")


@dataclass(frozen=True, slots=True)
class EventBatch:
    """Events delivered together, in position order; ``last_position`` is the value to save as
    the checkpoint once they are processed."""

    events: tuple[EventEnvelope, ...]
    last_position: int


class Subscription:
    """A catch-up-then-live reader of the global log; iterate it for ``EventBatch``es.

    ``name`` is None for an ephemeral subscription (no checkpoint). ``stop()`` may be called
    from any thread; iteration then ends within about 0.2 s. Use as a context manager, or call
    ``close()``, to release the LISTEN connection.
    """

    def __init__(self, recorder: EventRecorder, *, name: str | None,
                 options: SubscriptionOptions, start_after: int,
                 decode: Callable[[EventEnvelope], EventEnvelope] | None = None) -> None:
        self._recorder = recorder
        self.name = name
        self.options = options
        self._position = start_after
        self._decode = decode
        self._stopped = threading.Event()
        self._waiter: Waiter | None = None

    @property
    def position(self) -> int:
        """The position of the last event delivered (or the start position)."""
        return self._position

    def stop(self) -> None:
        """Make iteration end soon (thread-safe)."""
        self._stopped.set()

    def close(self) -> None:
        """Stop and release the LISTEN connection."""
        self.stop()
        self._close_waiter()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[EventBatch]:
        return self.batches()

    def save_checkpoint(self, position: int | None = None) -> None:
        """Save ``position`` (default: the last delivered) as this durable subscription's
        checkpoint, on the store's own connection. To commit it with your own writes, use
        ``EventStore.transaction()`` and ``UnitOfWork.save_checkpoint`` instead."""
        if self.name is None:
            raise EventStoreTerminalError(
                "an ephemeral subscription has no checkpoint; use EventStore.subscribe(name) "
                "for a durable one"
            )
        self._recorder.save_checkpoint(self.name, self._position if position is None
                                       else position)

    def events(self, *, idle_timeout_s: float | None = None) -> Iterator[EventEnvelope]:
        """The delivered events one by one (see ``batches``)."""
        for batch in self.batches(idle_timeout_s=idle_timeout_s):
            yield from batch.events

    def batches(self, *, idle_timeout_s: float | None = None) -> Iterator[EventBatch]:
        """Deliver batches until ``stop()``, or until nothing new arrived for
        ``idle_timeout_s`` seconds (None: wait forever)."""
        idle_since = time.monotonic()
        while not self._stopped.is_set():
            try:
                events = self._read()
            except EventStoreUnavailableError as e:
                self._retry_later(e)
                continue
            if events:
                last = events[-1].position or self._position
                self._position = last
                idle_since = time.monotonic()
                yield EventBatch(tuple(events), last)
                if len(events) == self.options.batch_size:
                    continue  # still catching up
            if idle_timeout_s is not None and time.monotonic() - idle_since >= idle_timeout_s:
                return
            try:
                self._wait(idle_since, idle_timeout_s)
            except EventStoreUnavailableError as e:
                self._retry_later(e)

    def _read(self) -> list[EventEnvelope]:
        events = self._recorder.read_log(LogQuery(
            from_position=self._position + 1, limit=self.options.batch_size,
            category=self.options.category, types=self.options.types,
            include_deleted=self.options.include_deleted,
        ))
        if self._decode is not None:
            events = [self._decode(e) for e in events]
        return events

    def _wait(self, idle_since: float, idle_timeout_s: float | None) -> None:
        if self._waiter is None:
            self._waiter = self._recorder.open_waiter()
        deadline = time.monotonic() + self.options.poll_interval_s
        if idle_timeout_s is not None:
            deadline = min(deadline, idle_since + idle_timeout_s)
        while not self._stopped.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if self._waiter.wait(min(remaining, _STOP_QUANTUM_S)):
                return

    def _retry_later(self, error: Exception) -> None:
        logger.warning("subscription %s: %s; retrying in %.1f s", self.name or "(tail)", error,
                       self.options.retry_interval_s)
        self._close_waiter()
        self._stopped.wait(self.options.retry_interval_s)

    def _close_waiter(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.close()

    def __repr__(self) -> str:
        kind: Any = repr(self.name) if self.name is not None else "ephemeral"
        return f"<Subscription {kind} at position {self._position}>"
