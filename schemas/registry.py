"""The event registry: domain events are pydantic models registered under a name and a version,
and upcasters bring payloads stored at older versions up to the current model on read.

    registry = EventRegistry()

    @registry.event("order.placed", version=2)
    class OrderPlaced(BaseModel):
        order_id: str
        amount_cents: int

    @registry.upcaster("order.placed", from_version=1)
    def _cents(data: dict[str, Any]) -> dict[str, Any]:
        return {"order_id": data["order_id"], "amount_cents": round(data["amount"] * 100)}

Guarantees:

- ``encode`` and ``validate`` refuse unknown types, old versions and payloads that do not
  validate against the registered model, so nothing invalid reaches the store.
- ``decode`` applies the upcasters ``v -> v+1`` in order, then validates with the current model;
  a missing step, a payload newer than the code, or a failing upcaster is a clear error.
- The registry does no I/O; it is safe to share between threads once registration is done.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticSerializationError

from lakefold.schemas.events import (
    EMPTY_METADATA,
    STREAM_DELETED_TYPE,
    SYSTEM_PREFIX,
    EventEnvelope,
    EventMetadata,
    NewEvent,
    new_event_id,
)
from lakefold.schemas.exceptions import (
    InvalidEventDataError,
    SchemaTypeError,
    SchemaValueError,
    UnknownEventTypeError,
    UpcastError,
)

ModelT = TypeVar("ModelT", bound=BaseModel)
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
UpcasterT = TypeVar("UpcasterT", bound=Upcaster)


class StreamDeletedRecord(BaseModel):
    """The record appended to a stream when it is deleted (type ``$stream.deleted``).

    ``mode`` is ``soft`` (events hidden from reads, kept) or ``hard`` (events erased);
    ``last_version`` is the stream's version before the deletion. Projections that see it
    should forget what they derived from ``stream_id``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stream_id: str
    mode: Literal["soft", "hard"]
    last_version: int


@dataclass(frozen=True, slots=True)
class EventType:
    """A registered event type: its name, current version and model."""

    name: str
    version: int
    model: type[BaseModel]


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise SchemaValueError(
            f"event type name {name!r} is invalid: use a non-empty string without surrounding "
            "spaces, e.g. 'order.placed'"
        )
    if name.startswith(SYSTEM_PREFIX):
        raise SchemaValueError(
            f"event type name {name!r} starts with {SYSTEM_PREFIX!r}, which is reserved for "
            "lakefold's own records; pick another name"
        )
    return name


def _check_version(version: object, what: str) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise SchemaValueError(f"{what} {version!r} is invalid: versions are integers >= 1")
    return version


def _validation_summary(error: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
        for err in error.errors()[:5]
    )


class EventRegistry:
    """Maps event type names to pydantic models (one current version each) and upcasters."""

    def __init__(self) -> None:
        self._by_name: dict[str, EventType] = {}
        self._by_model: dict[type[BaseModel], EventType] = {}
        self._upcasters: dict[tuple[str, int], Upcaster] = {}
        self._system: dict[str, type[BaseModel]] = {STREAM_DELETED_TYPE: StreamDeletedRecord}

    # -- registration -------------------------------------------------------------------------

    def add(self, model: type[BaseModel], *, name: str, version: int = 1) -> EventType:
        """Register ``model`` as the current version of event type ``name``."""
        _check_name(name)
        _check_version(version, "event version")
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise SchemaTypeError(
                f"{model!r} is not a pydantic model class; events must be BaseModels")
        if name in self._by_name:
            raise SchemaValueError(
                f"event type {name!r} is already registered (version "
                f"{self._by_name[name].version}, {self._by_name[name].model.__name__}); a name "
                "has one current model: bump its version and add an upcaster instead"
            )
        if model in self._by_model:
            raise SchemaValueError(
                f"{model.__name__} is already registered as {self._by_model[model].name!r}"
            )
        for (upcast_name, from_version) in self._upcasters:
            if upcast_name == name and from_version >= version:
                raise SchemaValueError(
                    f"an upcaster from version {from_version} of {name!r} exists, so its current "
                    f"version must be greater than {from_version}, not {version}"
                )
        event_type = EventType(name=name, version=version, model=model)
        self._by_name[name] = event_type
        self._by_model[model] = event_type
        if "__event_type__" not in vars(model):
            # what ``events(types=[Model])`` and ``Fold.on(Model)`` name the type by
            model.__event_type__ = name  # type: ignore[attr-defined]
        return event_type

    def event(self, name: str, *, version: int = 1) -> Callable[[type[ModelT]], type[ModelT]]:
        """Class decorator form of ``add``."""

        def register(model: type[ModelT]) -> type[ModelT]:
            self.add(model, name=name, version=version)
            return model

        return register

    def add_upcaster(self, name: str, *, from_version: int, upcaster: Upcaster) -> None:
        """Register the function that turns a payload of ``name`` at ``from_version`` into one
        at ``from_version + 1``. It receives a copy of the stored payload."""
        _check_name(name)
        _check_version(from_version, "upcaster from_version")
        if not callable(upcaster):
            raise SchemaTypeError(f"upcaster for {name!r} v{from_version} is not callable")
        current = self._by_name.get(name)
        if current is not None and from_version >= current.version:
            raise SchemaValueError(
                f"{name!r} is at version {current.version}; an upcaster from version "
                f"{from_version} would go beyond it"
            )
        if (name, from_version) in self._upcasters:
            raise SchemaValueError(f"an upcaster from version {from_version} of {name!r} exists")
        self._upcasters[(name, from_version)] = upcaster

    def upcaster(self, name: str, *, from_version: int) -> Callable[[UpcasterT], UpcasterT]:
        """Function decorator form of ``add_upcaster``."""

        def register(function: UpcasterT) -> UpcasterT:
            self.add_upcaster(name, from_version=from_version, upcaster=function)
            return function

        return register

    # -- lookup -------------------------------------------------------------------------------

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @property
    def names(self) -> list[str]:
        """The registered event type names, sorted."""
        return sorted(self._by_name)

    def get(self, name: str) -> EventType:
        """The registered type ``name``; UnknownEventTypeError when there is none."""
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(self.names) or "none"
            raise UnknownEventTypeError(
                f"event type {name!r} is not registered (registered: {known}); register its "
                "model with @registry.event(name, version=...)"
            ) from None

    def type_of(self, event: BaseModel) -> EventType:
        """The registered type of a domain event instance."""
        try:
            return self._by_model[type(event)]
        except KeyError:
            raise UnknownEventTypeError(
                f"{type(event).__name__} is not a registered event model; register it with "
                "@registry.event(name, version=...)"
            ) from None

    # -- append side --------------------------------------------------------------------------

    def encode(self, event: BaseModel, *, event_id: Any = None,
               metadata: EventMetadata = EMPTY_METADATA) -> NewEvent:
        """A ``NewEvent`` for a domain event instance, after checking that its payload still
        validates (a model built with ``model_construct`` or mutated after validation may
        not)."""
        if not isinstance(event, BaseModel):
            raise UnknownEventTypeError(
                f"{event!r} is a {type(event).__name__}, not a pydantic event model; append "
                "registered models or NewEvent values"
            )
        event_type = self.type_of(event)
        try:
            data = event.model_dump(mode="json", warnings="error")
        except (ValueError, TypeError, PydanticSerializationError) as e:
            raise InvalidEventDataError(
                f"{event_type.name} v{event_type.version} cannot be serialised to JSON: {e}"
            ) from e
        new = NewEvent(type=event_type.name, data=data, schema_version=event_type.version,
                       event_id=event_id if event_id is not None else new_event_id(),
                       metadata=metadata)
        return self.validate(new)

    def validate(self, new: NewEvent) -> NewEvent:
        """Check a ``NewEvent`` against the registry: known type, current version, valid
        payload. Returns it unchanged; raises UnknownEventTypeError or InvalidEventDataError."""
        event_type = self.get(new.type)
        if new.schema_version != event_type.version:
            raise InvalidEventDataError(
                f"{new.type} is registered at version {event_type.version}, but event "
                f"{new.event_id} says version {new.schema_version}; append the current version"
            )
        try:
            event_type.model.model_validate(new.data)
        except ValidationError as e:
            raise InvalidEventDataError(
                f"event {new.event_id} ({new.type} v{new.schema_version}) is invalid: "
                f"{_validation_summary(e)}; nothing was written"
            ) from e
        return new

    # -- read side ----------------------------------------------------------------------------

    def upcast(self, name: str, version: int, data: Mapping[str, Any]) -> dict[str, Any]:
        """The payload of ``name`` stored at ``version``, brought to the current version."""
        event_type = self.get(name)
        if version > event_type.version:
            raise UnknownEventTypeError(
                f"a stored {name} event is at version {version}, newer than the registered "
                f"version {event_type.version}; deploy the code that defines version {version}"
            )
        payload = dict(data)
        for step in range(version, event_type.version):
            upcaster = self._upcasters.get((name, step))
            if upcaster is None:
                raise UpcastError(
                    f"no upcaster from version {step} to {step + 1} of {name!r}; register one "
                    f"with @registry.upcaster({name!r}, from_version={step})"
                )
            try:
                payload = upcaster(payload)
            except Exception as e:
                raise UpcastError(
                    f"the upcaster from version {step} of {name!r} failed: "
                    f"{type(e).__name__}: {e}"
                ) from e
            if not isinstance(payload, dict):
                raise UpcastError(
                    f"the upcaster from version {step} of {name!r} returned a "
                    f"{type(payload).__name__}, not a dict"
                )
        return payload

    def decode(self, name: str, version: int, data: Mapping[str, Any]) -> BaseModel:
        """The domain event for a stored payload: upcast to the current version, validated."""
        system = self._system.get(name)
        if system is not None:
            return system.model_validate(data)
        event_type = self.get(name)
        payload = self.upcast(name, version, data)
        try:
            return event_type.model.model_validate(payload)
        except ValidationError as e:
            raise UpcastError(
                f"a stored {name} v{version} event does not validate as v{event_type.version}"
                f" after upcasting: {_validation_summary(e)}; fix the upcaster"
            ) from e

    def decode_envelope(self, envelope: EventEnvelope) -> EventEnvelope:
        """``envelope`` with ``event`` set to its decoded domain event."""
        return envelope.replace(event=self.decode(envelope.type, envelope.schema_version,
                                                  envelope.data))
