"""The contract every event recorder must pass, run against PostgreSQL and in memory
(eventsourcing's AggregateRecorderTestCase pattern). Subclasses provide ``make_store``."""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest
from pydantic import BaseModel

from lakefold.eventstore import (
    ANY,
    NO_STREAM,
    STREAM_EXISTS,
    EventStore,
    IdempotencyConflictError,
    InvalidRequestError,
    StreamDeletedError,
    StreamEvents,
    SubscriptionOptions,
    WrongExpectedVersionError,
)
from lakefold.schemas import (
    STREAM_DELETED_TYPE,
    EventMetadata,
    EventRegistry,
    InvalidEventDataError,
    NewEvent,
    StreamDeletedRecord,
    UnknownEventTypeError,
    UpcastError,
)


def ev(type_: str = "order.placed", **data: Any) -> NewEvent:
    return NewEvent(type=type_, data=data or {"n": 1})


DUPLICATE = ev()

# How a retried event can differ from the stored one, and the words the conflict uses for it.
_CHANGES: dict[str, Callable[[NewEvent], NewEvent]] = {
    "stream": lambda e: e,  # the retry goes to another stream
    "type": lambda e: replace(e, type="order.cancelled"),
    "schema_version": lambda e: replace(e, schema_version=2),
    "data": lambda e: replace(e, data={"n": 2}),
    "metadata": lambda e: replace(e, metadata=EventMetadata(extra={"user": "bob"})),
}
_NAMES = {"stream": "stream", "type": "type", "schema_version": "schema version",
          "data": "data", "metadata": "metadata"}


class Unregistered(BaseModel):
    x: int


def snapshot(store: EventStore) -> tuple[int, list[tuple[str, int]]]:
    """Everything a failed call must leave unchanged."""
    events = store.read_all(0, 100_000, include_deleted=True)
    return store.head(), [(e.stream_id, e.stream_version) for e in events]


class RecorderContract:
    """Shared behaviour of EventStore over any recorder."""

    make_store: Callable[..., EventStore]

    @pytest.fixture
    def store(self) -> Iterator[EventStore]:
        store = self.make_store()
        try:
            yield store
        finally:
            store.close()

    # -- appending and reading a stream -------------------------------------------------------

    def test_append_then_read_stream(self, store: EventStore) -> None:
        correlation, causation = uuid.uuid4(), uuid.uuid4()
        meta = EventMetadata(correlation_id=correlation, causation_id=causation,
                             extra={"user": "ann", "ip": "10.0.0.1"})
        first = NewEvent("order.placed", {"sku": "a", "qty": 2, "price": 9.5}, metadata=meta)
        result = store.append("order-1", [first, ev("order.paid", amount=19)],
                              expected_version=NO_STREAM)
        assert [e.stream_version for e in result.events] == [1, 2]
        assert result.events[0].event_id == first.event_id
        assert result.stream_versions == {"order-1": 2}
        assert not result.duplicate
        events = store.read_stream("order-1")
        assert [(e.stream_version, e.type) for e in events] == [(1, "order.placed"),
                                                               (2, "order.paid")]
        got = events[0]
        assert got.event_id == first.event_id and got.stream_id == "order-1"
        assert got.data == {"sku": "a", "qty": 2, "price": 9.5}
        assert got.schema_version == 1 and got.category == "order"
        assert got.metadata == meta
        assert isinstance(got.recorded_at, datetime) and got.recorded_at.tzinfo is not None
        assert events[1].metadata == EventMetadata()
        store.append("order-1", [ev(n=3), ev(n=4), ev(n=5)], expected_version=2)
        assert [e.stream_version for e in store.read_stream("order-1", from_version=3)] == [
            3, 4, 5]
        assert [e.stream_version for e in store.read_stream("order-1", backwards=True,
                                                            limit=2)] == [5, 4]
        assert [e.stream_version for e in store.read_stream(
            "order-1", backwards=True, from_version=2)] == [2, 1]
        assert store.read_stream("order-2") == []
        state = store.stream_state("order-1")
        assert (state.version, state.deleted, state.exists) == (5, None, True)
        assert not store.stream_state("order-2").exists

    def test_expected_versions(self, store: EventStore) -> None:
        store.append("acct-1", [ev()], expected_version=NO_STREAM)
        with pytest.raises(WrongExpectedVersionError) as info:
            store.append("acct-1", [ev()], expected_version=NO_STREAM)
        assert info.value.actual_version == 1 and info.value.stream_id == "acct-1"
        with pytest.raises(WrongExpectedVersionError) as info:
            store.append("acct-1", [ev()], expected_version=0)  # 0 is "no stream"
        assert info.value.actual_version == 1
        with pytest.raises(WrongExpectedVersionError) as info:
            store.append("acct-1", [ev()], expected_version=7)
        assert info.value.actual_version == 1
        assert "version 7" in str(info.value) and "version 1" in str(info.value)
        with pytest.raises(WrongExpectedVersionError) as info:
            store.append("acct-2", [ev()], expected_version=STREAM_EXISTS)
        assert info.value.actual_version is None
        with pytest.raises(WrongExpectedVersionError) as info:
            store.append("acct-2", [ev()], expected_version=1)
        assert info.value.actual_version is None
        assert store.append("acct-1", [ev()], expected_version=STREAM_EXISTS).stream_versions \
            == {"acct-1": 2}
        assert store.append("acct-1", [ev()], expected_version=2).stream_versions == {
            "acct-1": 3}
        assert store.append("acct-1", [ev()], expected_version=ANY).stream_versions == {
            "acct-1": 4}
        assert store.append("acct-3", [ev()]).stream_versions == {"acct-3": 1}
        assert store.stream_state("acct-1").version == 4
        assert not store.stream_state("acct-2").exists

    def test_multi_stream_append_is_atomic(self, store: EventStore) -> None:
        store.append("cart-1", [ev()], expected_version=NO_STREAM)
        before = snapshot(store)
        with pytest.raises(WrongExpectedVersionError) as info:
            store.append_streams([
                StreamEvents("cart-0", [ev(), ev()], NO_STREAM),
                StreamEvents("cart-1", [ev()], 5),
                StreamEvents("stock-9", [ev()], ANY),
            ])
        assert info.value.stream_id == "cart-1" and info.value.actual_version == 1
        assert snapshot(store) == before
        assert not store.stream_state("cart-0").exists
        result = store.append_streams([
            StreamEvents("cart-0", [ev(), ev()], NO_STREAM),
            StreamEvents("cart-1", [ev()], 1),
            StreamEvents("stock-9", [ev()]),
        ])
        assert result.stream_versions == {"cart-0": 2, "cart-1": 2, "stock-9": 1}
        head = store.head()
        assert head == 5
        positions = [e.position for e in store.wait_for_positions(result).events]
        assert positions == [2, 3, 4, 5]  # one commit: consecutive, in append order

    def test_idempotent_retry_returns_the_original(self, store: EventStore) -> None:
        events = [ev(n=1), ev(n=2)]
        first = store.wait_for_positions(
            store.append("pay-1", events, expected_version=NO_STREAM))
        store.append("pay-1", [ev(n=3)])
        again = store.append("pay-1", events, expected_version=NO_STREAM)
        assert again.duplicate
        assert [(e.event_id, e.stream_version, e.position) for e in again.events] == [
            (e.event_id, e.stream_version, e.position) for e in first.events]
        again_any = store.append("pay-1", events)  # ANY passes the version check
        assert again_any.duplicate and again_any.stream_versions == {"pay-1": 2}
        assert len(store.read_stream("pay-1")) == 3
        before = snapshot(store)
        changed = NewEvent("order.placed", {"n": 99}, event_id=events[0].event_id)
        with pytest.raises(IdempotencyConflictError, match="different data"):
            store.append("pay-1", [changed, events[1]])
        with pytest.raises(IdempotencyConflictError, match="different stream"):
            store.append("pay-2", [events[0]])  # same event, other stream
        with pytest.raises(IdempotencyConflictError, match="1 of the 2"):
            store.append("pay-1", [events[0], ev(n=5)])
        assert snapshot(store) == before

    def test_idempotency_conflict_names_exactly_what_differs(self, store: EventStore) -> None:
        """A retry that reuses an event id with other fields changed is refused, and the
        message names exactly the fields that differ (and only those), and what to do: every
        non-empty combination of changes, in a single-event and a multi-event append."""
        combinations = [set(c) for n in range(1, len(_CHANGES) + 1)
                        for c in itertools.combinations(sorted(_CHANGES), n)]
        for k, changes in enumerate(combinations):
            stream = f"idem-{k}"
            meta = EventMetadata(correlation_id=uuid.uuid4(), extra={"user": "ann"})
            original = NewEvent("order.placed", {"n": 1}, metadata=meta)
            others = [ev(n=n) for n in range(k % 3)]
            store.wait_for_positions(store.append(stream, [original, *others]))
            before = snapshot(store)
            retry = original
            for change in changes:
                retry = _CHANGES[change](retry)
            target = f"{stream}-b" if "stream" in changes else stream
            with pytest.raises(IdempotencyConflictError) as info:
                store.append(target, [retry, *others])
            message = str(info.value)
            named = {c for c, words in _NAMES.items() if f"different {words}" in message}
            assert named == changes, message
            assert "payload" not in message
            assert f"({stream} v1)" in message and "use a new event id" in message
            assert snapshot(store) == before

    # -- the global log -----------------------------------------------------------------------

    def test_global_order_category_and_types(self, store: EventStore) -> None:
        store.append("order-1", [ev("order.placed"), ev("order.paid")])
        store.append("invoice-1", [ev("invoice.sent")])
        store.append("order-2", [ev("order.placed")])
        store.append("orderline-1", [ev("order.placed")])
        assert store.head() == 5
        everything = store.read_all()
        assert [e.position for e in everything] == [1, 2, 3, 4, 5]
        assert [e.position for e in store.read_all(0, 10)] == [1, 2, 3, 4, 5]
        assert [e.position for e in store.read_all(3, 2)] == [3, 4]  # inclusive
        assert [e.position for e in store.read_all(2, 10, to_position=4)] == [2, 3]
        assert store.read_all(6) == []
        orders = store.read_category("order")
        assert [(e.stream_id, e.position) for e in orders] == [
            ("order-1", 1), ("order-1", 2), ("order-2", 4)]
        assert [e.position for e in store.read_category("order-", 2, 1)] == [2]
        placed = store.read_all(types=["order.placed"])
        assert [e.position for e in placed] == [1, 4, 5]
        assert [e.position for e in store.read_all(types=["order.paid", "invoice.sent"])] == [
            2, 3]
        assert [e.position for e in store.read_category("order", types=["order.placed"])] == [
            1, 4]
        assert [e.position for e in store.read_all(2, 1, types=["order.placed"])] == [4]

    def test_soft_delete_hides_and_records(self, store: EventStore) -> None:
        store.append("user-1", [ev("user.joined"), ev("user.renamed")])
        store.append("user-2", [ev("user.joined")])
        record = store.delete_stream("user-1", expected_version=2)
        assert record.type == STREAM_DELETED_TYPE and record.is_deletion
        assert record.stream_version == 3
        assert record.data == {"stream_id": "user-1", "mode": "soft", "last_version": 2}
        assert [e.type for e in store.read_stream("user-1")] == [STREAM_DELETED_TYPE]
        assert len(store.read_stream("user-1", include_deleted=True)) == 3
        log = store.read_all()
        assert [(e.stream_id, e.type) for e in log] == [
            ("user-2", "user.joined"), ("user-1", STREAM_DELETED_TYPE)]
        assert [e.position for e in log] == [3, 4]
        assert len(store.read_all(include_deleted=True)) == 4
        assert [e.type for e in store.read_category("user", types=["user.joined"])] == [
            "user.joined", STREAM_DELETED_TYPE]  # deletion records pass type filters
        assert store.stream_state("user-1").deleted == "soft"
        before = snapshot(store)
        with pytest.raises(StreamDeletedError, match="soft-deleted"):
            store.append("user-1", [ev()])
        with pytest.raises(StreamDeletedError):
            store.delete_stream("user-1")
        assert snapshot(store) == before
        hard = store.delete_stream("user-1", hard=True)
        assert hard.data["mode"] == "hard" and hard.stream_version == 4
        assert store.stream_state("user-1").deleted == "hard"

    def test_pages_fill_up_across_hidden_and_erased_events(self, store: EventStore) -> None:
        store.append("user-1", [ev("user.joined") for _ in range(3)])
        store.append("gone-1", [ev("user.joined") for _ in range(4)])
        store.append("hidden-1", [ev("user.joined") for _ in range(5)])
        store.append("user-2", [ev("user.joined") for _ in range(3)])
        assert store.head() == 15  # positions first: erased events leave holes
        store.delete_stream("gone-1", hard=True)
        store.delete_stream("hidden-1")
        assert store.head() == 17
        visible = [1, 2, 3, 13, 14, 15, 16, 17]  # 4-7 erased, 8-12 hidden; 16, 17 deletions
        assert [e.position for e in store.read_all(0, 100)] == visible
        pages, position = [], 0
        while True:
            page = store.read_all(position, 2)
            pages.append([e.position for e in page])
            if len(page) < 2:
                break
            position = (page[-1].position or 0) + 1
        assert pages == [[1, 2], [3, 13], [14, 15], [16, 17], []]
        assert [e.position for e in store.read_all(2, 3, to_position=14)] == [2, 3, 13]
        assert len(store.read_all(0, 100, include_deleted=True)) == 13

    def test_hard_delete_erases(self, store: EventStore) -> None:
        first = [ev("user.joined", email="ann@example.com")]
        store.append("user-7", first)
        store.append("user-8", [ev("user.joined")])
        with pytest.raises(WrongExpectedVersionError):
            store.delete_stream("user-7", expected_version=3, hard=True)
        with pytest.raises(WrongExpectedVersionError):
            store.delete_stream("user-9", hard=True)
        store.delete_stream("user-7", hard=True)
        kept = store.read_stream("user-7", include_deleted=True)
        assert [e.type for e in kept] == [STREAM_DELETED_TYPE]
        everything = store.read_all(include_deleted=True)
        assert [e.stream_id for e in everything] == ["user-8", "user-7"]
        assert all("ann@example.com" not in str(e.data) for e in everything)
        with pytest.raises(StreamDeletedError, match="hard-deleted"):
            store.append("user-7", first)  # the erased ids are gone, the stream stays dead
        with pytest.raises(StreamDeletedError):
            store.delete_stream("user-7", hard=True)

    # -- checkpoints and subscriptions --------------------------------------------------------

    def test_checkpoints(self, store: EventStore) -> None:
        assert store.load_checkpoint("billing") is None
        store.save_checkpoint("billing", 5)
        store.save_checkpoint("billing", 7)
        store.save_checkpoint("audit", 0)
        assert store.load_checkpoint("billing") == 7
        assert store.load_checkpoint("audit") == 0
        with pytest.raises(InvalidRequestError):
            store.save_checkpoint("billing", -1)
        with pytest.raises(InvalidRequestError):
            store.save_checkpoint("", 1)

    @pytest.mark.timeout(60)
    def test_subscription_catches_up_then_follows_live(self, store: EventStore) -> None:
        store.append("order-1", [ev(n=i) for i in range(5)])
        store.append("other-1", [ev("other.thing")])
        options = SubscriptionOptions(category="order", batch_size=2, poll_interval_s=5.0)
        received: list[int] = []
        with store.subscribe("orders", options) as sub:
            def writer() -> None:
                store.append("order-2", [ev(n=10)])
                store.append("other-2", [ev("other.thing")])
                store.append("order-1", [ev(n=11), ev(n=12)])

            started = threading.Thread(target=writer)
            for batch in sub:
                assert len(batch.events) <= 2
                received.extend(e.position for e in batch.events if e.position)
                assert batch.last_position == batch.events[-1].position
                if len(received) >= 5 and started.ident is None:
                    started.start()
                if len(received) >= 8:
                    sub.save_checkpoint()
                    break
        started.join()
        assert received == sorted(received) and len(set(received)) == 8
        assert [e.position for e in store.read_category("order")] == received
        assert store.load_checkpoint("orders") == received[-1]
        store.append("order-3", [ev(n=13)])
        with store.subscribe("orders", options) as again:  # resumes after the checkpoint
            resumed = [e.data["n"] for e in again.events(idle_timeout_s=1.0)]
        assert resumed == [13]

    @pytest.mark.timeout(60)
    def test_tail_starts_at_the_head(self, store: EventStore) -> None:
        store.append("order-1", [ev(n=1)])
        tail = store.tail()
        store.append("order-1", [ev(n=2)])
        with tail:
            got = [e.data["n"] for e in tail.events(idle_timeout_s=1.0)]
        assert got == [2]
        with store.tail(from_position=1) as everything:
            assert [e.data["n"] for e in everything.events(idle_timeout_s=0.5)] == [1, 2]
        with pytest.raises(Exception, match="ephemeral"):
            store.tail().save_checkpoint(1)

    # -- registry and upcasting ---------------------------------------------------------------

    def test_registry_validates_appends_and_upcasts_reads(self) -> None:
        old = EventRegistry()

        @old.event("order.placed", version=1)
        class PlacedV1(BaseModel):
            order_id: str
            amount: float

        with self.make_store(registry=old) as store_v1:
            store_v1.append("order-1", [PlacedV1(order_id="o1", amount=12.5)])
            new = EventRegistry()

            @new.event("order.placed", version=3)
            class Placed(BaseModel):
                order_id: str
                amount_cents: int
                currency: str

            @new.upcaster("order.placed", from_version=1)
            def to_v2(data: dict[str, Any]) -> dict[str, Any]:
                return {"order_id": data["order_id"], "amount_cents": round(data["amount"] * 100)}

            @new.upcaster("order.placed", from_version=2)
            def to_v3(data: dict[str, Any]) -> dict[str, Any]:
                return {**data, "currency": "EUR"}

            store_v3 = EventStore.from_recorder(store_v1.recorder, registry=new)
            store_v3.append("order-1", [Placed(order_id="o2", amount_cents=5, currency="USD")])
            events = store_v3.read_stream("order-1")
            assert [e.schema_version for e in events] == [1, 3]
            assert events[0].data == {"order_id": "o1", "amount": 12.5}  # stored as it was
            assert events[0].event == Placed(order_id="o1", amount_cents=1250, currency="EUR")
            assert events[1].event == Placed(order_id="o2", amount_cents=5, currency="USD")
            assert store_v3.read_all()[0].event == events[0].event
            store_v3.append("order-1", [NewEvent("order.placed", {"order_id": "o3",
                                                                  "amount_cents": 1,
                                                                  "currency": "EUR"},
                                                 schema_version=3)])
            record = store_v3.delete_stream("order-1")
            assert isinstance(record.event, StreamDeletedRecord)
            assert record.event.last_version == 3
            before = snapshot(store_v3)
            with pytest.raises(UnknownEventTypeError):
                store_v3.append("order-2", [NewEvent("order.shipped", {})])
            with pytest.raises(UnknownEventTypeError):
                store_v3.append("order-2", [PlacedV1(order_id="x", amount=1)])
            with pytest.raises(InvalidEventDataError, match="amount_cents"):
                store_v3.append("order-2", [NewEvent("order.placed", {"order_id": "o"},
                                                     schema_version=3)])
            with pytest.raises(InvalidEventDataError, match="version 3"):
                store_v3.append("order-2", [NewEvent("order.placed", {"order_id": "o",
                                                                      "amount": 1})])
            bad = Placed.model_construct(order_id="o", amount_cents="lots",  # type: ignore[arg-type]
                                         currency="EUR")
            with pytest.raises(InvalidEventDataError):
                store_v3.append("order-2", [bad])
            assert snapshot(store_v3) == before
            broken = EventRegistry()
            broken.add(Placed, name="order.placed", version=3)
            with pytest.raises(UpcastError, match="from_version=1"):
                EventStore.from_recorder(store_v1.recorder, registry=broken).read_all(
                    include_deleted=True)

    # -- invalid input ------------------------------------------------------------------------

    @pytest.mark.parametrize(("call", "match"), [
        (lambda s: s.append("", [ev()]), "empty"),
        (lambda s: s.append(" order-1", [ev()]), "spaces"),
        (lambda s: s.append("$system-1", [ev()]), "reserved"),
        (lambda s: s.append("-1", [ev()]), "empty category"),
        (lambda s: s.append("o\x00-1", [ev()]), "NUL"),
        (lambda s: s.append("order-" + "x" * 600, [ev()]), "limit"),
        (lambda s: s.append(42, [ev()]), "not a str"),
        (lambda s: s.append("order-1", []), "no events"),
        (lambda s: s.append("order-1", ev()), "list of events"),
        (lambda s: s.append("order-1", [{"type": "x"}]), "not a NewEvent"),
        (lambda s: s.append("order-1", [NewEvent("", {})]), "invalid type"),
        (lambda s: s.append("order-1", [NewEvent("$stream.deleted", {})]), "written by"),
        (lambda s: s.append("order-1", [NewEvent("a", {}, schema_version=0)]), ">= 1"),
        (lambda s: s.append("order-1", [NewEvent("a", [1, 2])]), "JSON object"),  # type: ignore[arg-type]
        (lambda s: s.append("order-1", [NewEvent("a", {"x": object()})]), "JSON-serialisable"),
        (lambda s: s.append("order-1", [NewEvent("a", {"x": float("nan")})]),
         "JSON-serialisable"),
        (lambda s: s.append("order-1", [NewEvent("a", {"x": "a\x00b"})]), "NUL"),
        (lambda s: s.append("order-1", [NewEvent("a", {}, event_id="e1")]), "not a UUID"),  # type: ignore[arg-type]
        (lambda s: s.append("order-1", [NewEvent(
            "a", {}, metadata=EventMetadata(correlation_id="c"))]), "not a UUID"),  # type: ignore[arg-type]
        (lambda s: s.append("order-1", [NewEvent("a", {}, metadata=EventMetadata(
            extra={"k": {1, 2}}))]), "JSON-serialisable"),
        (lambda s: s.append("order-1", [NewEvent("a", {}, metadata={"c": 1})]), "EventMetadata"),  # type: ignore[arg-type]
        (lambda s: s.append("order-1", [ev()], expected_version=-1), "negative"),
        (lambda s: s.append("order-1", [ev()], expected_version="any"), "expected_version"),
        (lambda s: s.append("order-1", [ev()], expected_version=True), "expected_version"),
        (lambda s: s.append("order-1", [DUPLICATE, DUPLICATE]), "twice"),
        (lambda s: s.append_streams([StreamEvents("order-1", [ev()]),
                                     StreamEvents("order-1", [ev()])]), "twice"),
        (lambda s: s.append_streams([]), "nothing to append"),
        (lambda s: s.append_streams([("order-1", [ev()], ANY)]), "not a StreamEvents"),
        (lambda s: s.append("order-1", [Unregistered(x=1)]), "no registry"),
        (lambda s: s.read_all(-1), "positions"),
        (lambda s: s.read_all(0, 0), "limit"),
        (lambda s: s.read_all(0, 10, types="order.placed"), "list of event type"),
        (lambda s: s.read_all(0, 10, types=[]), "non-empty"),
        (lambda s: s.read_category("order-1"), "category"),
        (lambda s: s.read_category(""), "category"),
        (lambda s: s.read_stream("order-1", from_version=-2), "from_version"),
        (lambda s: s.read_stream("order-1", limit=0), "limit"),
        (lambda s: s.delete_stream("order-1", hard="yes"), "hard"),
        (lambda s: s.subscribe(""), "name"),
        (lambda s: SubscriptionOptions(batch_size=0), "limit"),
        (lambda s: SubscriptionOptions(poll_interval_s=float("inf")), "seconds"),
        (lambda s: s.wait_for_positions(s.append("order-9", [ev()]), timeout_s=-1), "seconds"),
    ])
    def test_invalid_input_is_refused_and_writes_nothing(
        self, store: EventStore, call: Callable[[Any], Any], match: str
    ) -> None:
        store.append("order-1", [ev()])
        before = snapshot(store)
        with pytest.raises((InvalidRequestError, UnknownEventTypeError), match=match):
            call(store)
        after = snapshot(store)
        assert after == before or after[1][:-1] == before[1]  # (the wait_for_positions case)
