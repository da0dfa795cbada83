"""Aggregates: domain objects whose state is the fold of their own stream of events.

    class Account(Aggregate):
        category = "account"            # stream ids are "account-<id>"

        def __init__(self, id: str) -> None:
            super().__init__(id)
            self.balance = 0

        def deposit(self, amount: int) -> None:       # a command: check, then raise events
            if amount <= 0:
                raise ValueError("deposit a positive amount")
            self.raise_event(Deposited(amount=amount))

        @when(Deposited)                               # the state change, and nothing else
        def _deposited(self, event: Deposited) -> None:
            self.balance += event.amount

A command checks the aggregate's state and raises events (registered pydantic models); each
raised event is applied at once through its ``@when`` handler and kept as *pending* until a
``Repository`` saves it. Loading replays the stream through the same handlers, with payloads
decoded and upcast by the store's registry, so old events reach a handler in today's shape.
``version`` is the stream version of the last event applied (pending ones included).

Compared with the anchors:

- ``eventsourcing``'s ``Aggregate`` with ``@event("Deposited")`` on a method makes the method's
  body the state change and builds the event class from its signature. lakefold keeps the
  command and the state change apart (Marten's ``Apply`` methods, Axon's
  ``@EventSourcingHandler``): the event is a model of the schema registry, with its versions and
  upcasters, shared with projections and views, and a command can validate before raising and
  raise several events or none. The cost is a few more lines per event.
- Marten discovers ``Apply(Event)`` overloads by name and signature; Python has no overloads,
  so handlers are named by ``@when(EventClass)``. A missing handler is an error when the event
  is raised or loaded, not a silent skip: an event that does not change the state still says
  so with an empty handler.
- Snapshots (``Repository(snapshot_every=N)``) store ``snapshot_state()``: by default the
  public attributes, as JSON; a class with other state overrides ``snapshot_state`` and
  ``restore_state`` and bumps ``snapshot_version`` when their shape changes (older snapshots
  are then ignored and the aggregate is replayed from its events).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from lakefold.eventstore._model import check_category
from lakefold.eventstore.exceptions import EventStoreTerminalError

E = TypeVar("E", bound=BaseModel)
Handler = Callable[[Any, Any], None]


class AggregateError(EventStoreTerminalError):
    """An aggregate class or its events do not fit together (a missing handler, no category)."""


def when(event_class: type[E]) -> Callable[[Callable[[Any, E], None]], Callable[[Any, E], None]]:
    """Mark a method as the state change of ``event_class`` (see the module docstring)."""
    if not (isinstance(event_class, type) and issubclass(event_class, BaseModel)):
        raise AggregateError(f"@when takes an event model class, not {event_class!r}")

    def mark(method: Callable[[Any, E], None]) -> Callable[[Any, E], None]:
        method.__lakefold_when__ = event_class  # type: ignore[attr-defined]
        return method

    return mark


class Aggregate:
    """A domain aggregate (see the module docstring)."""

    #: Stream ids are ``f"{category}-{id}"``.
    category: ClassVar[str]
    #: The shape of ``snapshot_state``; bump it when that shape changes.
    snapshot_version: ClassVar[int] = 1
    _handlers: ClassVar[dict[type[BaseModel], Handler]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        handlers: dict[type[BaseModel], Handler] = {}
        for klass in reversed(cls.__mro__):
            for attribute in vars(klass).values():
                event_class = getattr(attribute, "__lakefold_when__", None)
                if event_class is not None:
                    handlers[event_class] = attribute
        cls._handlers = handlers
        category = vars(cls).get("category")
        if category is not None:
            try:
                check_category(category)
            except ValueError as e:
                raise AggregateError(f"{cls.__name__}.category: {e}") from e

    def __init__(self, id: str) -> None:
        if not isinstance(id, str) or not id:
            raise AggregateError(f"{type(self).__name__} needs a non-empty string id")
        if not isinstance(getattr(type(self), "category", None), str):
            raise AggregateError(
                f"{type(self).__name__} has no category; set category = 'name' on the class "
                "(its streams are 'name-<id>')")
        self.id = id
        self.version = 0
        self._pending: list[BaseModel] = []

    @property
    def stream_id(self) -> str:
        return f"{self.category}-{self.id}"

    @property
    def pending(self) -> tuple[BaseModel, ...]:
        """Events raised since the aggregate was loaded or last saved."""
        return tuple(self._pending)

    @property
    def saved_version(self) -> int:
        """The stream's version this aggregate was loaded at (what a save expects)."""
        return self.version - len(self._pending)

    def raise_event(self, event: BaseModel) -> None:
        """Apply ``event`` now and keep it for the next save. If the handler raises, the event
        is not kept."""
        self._apply(event)
        self._pending.append(event)

    def _apply(self, event: BaseModel) -> None:
        handler = self._handlers.get(type(event))
        if handler is None:
            raise AggregateError(
                f"{type(self).__name__} has no @when({type(event).__name__}) handler; add "
                "one (an empty one if the event changes nothing)")
        handler(self, event)
        self.version += 1

    def _saved(self) -> None:
        self._pending.clear()

    # ------------------------------------------------------------------ snapshots

    def snapshot_state(self) -> dict[str, Any]:
        """The state a snapshot keeps: the public attributes, as JSON-able values."""
        state = {k: v for k, v in vars(self).items()
                 if not k.startswith("_") and k not in ("id", "version")}
        out: dict[str, Any] = to_jsonable_python(state)
        return out

    def restore_state(self, state: dict[str, Any]) -> None:
        """Set the state ``snapshot_state`` returned (of this ``snapshot_version``)."""
        for name, value in state.items():
            setattr(self, name, value)
