"""The target protocol: what every projection target (Delta, Redis, search) does, so that the
runner, the rebuilds and the readers never switch on the kind of target.

Two halves:

- ``Target``: the definition a user writes (``delta_table(...)``, ``redis_cache(...)``,
  ``search_index(...)``; the frozen dataclasses of ``_model``, which pickle to Spark's
  workers). It validates itself against a projection (at registration: ``check_fold_key``;
  before anything runs: ``check_output``), says how the sources hand it truncates
  (``truncate_mode``) and whether it keeps every version (``keeps_history``), and ``open``\\ s
  one generation's storage.
- ``GenerationTarget``: one generation's storage, opened. It writes a batch *together with
  its checkpoint* (exactly-once effect: a batch id the storage already holds is skipped; each
  kind keeps its own mechanism: Delta's app transaction, Redis's Lua position guard and
  checkpoint, the search index's batch id stored in the commit), deletes keys and truncates
  (both as batches, under the same checkpoint), reads rows by key, lists its keys, repairs
  rows in place (a targeted rebuild, outside the batch sequence), and drops its storage.

Where a generation's storage lives is fixed by the catalog when the generation is created
(``Generation.location(kind)``); ``TARGET_KINDS`` maps each kind to its implementation, so
that retired generations are dropped whatever kind of target they were built for.

A new kind of target is one module (a ``Target`` dataclass and its ``GenerationTarget``), one
line in ``TARGET_KINDS`` (and a root in ``SinkRoots.locations``), and one line in the shared
contract test (tests/projections/target_contract.py).

For the views issue, ``replace`` ("replace the rows of these keys with these rows", one batch:
upserts plus deletes of the keys that vanished) and ``read`` (rows by key) are there already,
with defaults built on ``write``. A view whose affected (partition) keys are not its output
keys will need "the rows whose column C is in these values": a new method with a default, which
is why ``GenerationTarget`` is a base class and not a bare protocol (a method added with a
default breaks no implementation; a kind overrides it where it can do better).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast, runtime_checkable

import pyarrow as pa

from lakefold.projections.definitions._model import DELETED_COLUMN, ProjectionShape
from lakefold.projections.exceptions import TargetError
from lakefold.spark.internals import Mode, Truncate

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


#: How a changelog source hands truncates to a target (see ``_truncate``).
TruncateMode = Mode


@dataclass(frozen=True)
class TargetContext:
    """What opening a generation's storage needs besides its location: the projection and
    generation it belongs to (Delta's app id), the services (Redis), and the output schema
    (the search index's layout; None: taken from the first batch)."""

    projection: str
    generation: int
    redis_url: str | None = None
    redis_namespace: str = "lf"
    schema: pa.Schema | None = None
    #: A NULL key is a key (a view's group of NULLs), not a bad row (Redis, search).
    null_keys: bool = False


@dataclass(frozen=True)
class TargetBatch:
    """One batch as a target applies it: its id (the checkpoint), its source position (what
    rows without a ``_position`` column reflect), and the source's truncates in it, in
    position order (the target replaces its content: see ``_truncate``)."""

    batch_id: int
    position: int = 0
    truncates: Sequence[Truncate] = ()


#: Rows a target refused (row, error): the caller dead-letters them.
Rejected = list[tuple[dict[str, Any], str]]


class GenerationTarget(ABC):
    """One generation's storage of one kind of target (see the module docstring)."""

    kind: ClassVar[str]

    def __init__(self, location: str, context: TargetContext) -> None:
        self.location = location
        self.context = context

    @property
    @abstractmethod
    def keys(self) -> tuple[str, ...]:
        """The key columns of a row."""

    @property
    def max_driver_rows(self) -> int | None:
        """The most rows a batch is collected to the driver for (``write``); bigger ones go
        through ``write_frame``. None: always on the driver; 0: never."""
        return None

    @abstractmethod
    def write(self, rows: pa.Table, batch: TargetBatch, *,
              rejected: Rejected | None = None) -> bool:
        """Apply ``rows`` (upserts; rows with ``_deleted`` true delete their key) as
        ``batch``, together with its checkpoint; returns False when the storage already held
        the batch (nothing was applied). Rows the target cannot take go to ``rejected`` (or
        raise ``TargetError`` when it is None)."""

    def write_frame(self, df: DataFrame, batch: TargetBatch) -> bool:
        """``write`` from a Spark DataFrame; targets that can write in Spark's tasks
        override it."""
        return self.write(df.toArrow(), batch)

    def delete(self, keys: pa.Table, batch: TargetBatch) -> bool:
        """Delete the rows of ``keys`` (a table of the key columns) as ``batch``."""
        flags = pa.array([True] * keys.num_rows, pa.bool_())
        return self.write(keys.append_column(DELETED_COLUMN, flags), batch)

    def replace(self, keys: pa.Table, rows: pa.Table, batch: TargetBatch) -> bool:
        """Replace the rows of ``keys`` (a table of the key columns) with ``rows``, as one
        batch: the keys that ``rows`` does not hold are deleted, the others upserted (the
        per-batch step of a view whose affected keys are its output keys)."""
        held = set(zip(*(rows.column(k).to_pylist() for k in self.keys), strict=True))
        gone = [i for i, key in enumerate(zip(*(keys.column(k).to_pylist()
                                                for k in self.keys), strict=True))
                if key not in held]
        tombstones = keys.select(list(self.keys)).take(pa.array(gone, pa.int64()))
        tombstones = tombstones.append_column(
            DELETED_COLUMN, pa.array([True] * len(gone), pa.bool_()))
        if DELETED_COLUMN not in rows.column_names:
            rows = rows.append_column(DELETED_COLUMN,
                                      pa.array([False] * rows.num_rows, pa.bool_()))
        return self.write(pa.concat_tables([rows, tombstones], promote_options="default"),
                          batch)

    def truncate(self, batch: TargetBatch) -> bool:
        """Remove every row as ``batch`` (whose ``truncates`` name the truncate)."""
        if not batch.truncates:
            raise TargetError("truncate() needs a batch with at least one truncate")
        return self.write(pa.table({}), batch)

    @abstractmethod
    def read(self, keys: Sequence[object]) -> dict[str, dict[str, Any]]:
        """The rows of ``keys`` (values of the first key column) that the storage holds, by
        the key's text (``key_text``), as the kind's readers return them."""

    @abstractmethod
    def stored_keys(self) -> list[object]:
        """Every key the storage holds (a scan: for repairs and tests)."""

    @abstractmethod
    def checkpoint(self) -> int | None:
        """The last batch id applied (None for fresh storage)."""

    @abstractmethod
    def repair(self, rows: pa.Table, position: int) -> None:
        """Write ``rows`` in place outside the batch sequence (a targeted rebuild): the batch
        checkpoint stays where it is, and no key moves backwards where the kind keeps
        positions."""

    def publish(self) -> None:  # noqa: B027 - optional: most kinds resolve through the catalog
        """Point readers at this generation (after the catalog switched to it)."""

    def close(self) -> None:  # noqa: B027 - optional: not every kind holds a connection
        """Release connections and writers."""

    def drop(self) -> None:
        """Delete this generation's storage (close it first)."""
        type(self).drop_storage(self.location, self.context)

    @classmethod
    @abstractmethod
    def drop_storage(cls, location: str, context: TargetContext) -> None:
        """Delete the storage at ``location`` (a retired generation's; idempotent)."""


@runtime_checkable
class Target(Protocol):
    """A projection's target as the user defines it (see the module docstring)."""

    @property
    def kind(self) -> str: ...

    @property
    def keys(self) -> tuple[str, ...]: ...

    @property
    def truncate_mode(self) -> TruncateMode:
        """How a transform's changelog sources hand truncates to this target."""
        ...

    @property
    def keeps_history(self) -> bool:
        """True when the target keeps every version, not the latest state per key (it
        cannot be rebuilt from a compacted stream)."""
        ...

    def describe(self) -> str:
        """A few words naming the target in messages ("a Delta scd2 target")."""
        ...

    def check_fold_key(self, projection: str, key_column: str) -> None:
        """Refuse a fold whose key column the target is not keyed by (at registration)."""
        ...

    def check_output(self, projection: ProjectionShape, columns: list[str],
                     types: Mapping[str, str], *, stateful: bool) -> None:
        """Refuse an output (columns and Spark types) the target cannot take."""
        ...

    def check_repairable(self, projection: str) -> None:
        """Refuse a targeted rebuild when rows cannot be corrected one key at a time."""
        ...

    def open(self, location: str, context: TargetContext) -> GenerationTarget:
        """One generation's storage at ``location``."""
        ...


#: Kind → its ``GenerationTarget`` ("module:class", imported when needed: Spark's workers
#: load the definitions without any target's driver library).
TARGET_KINDS: dict[str, str] = {
    "delta": "lakefold.projections.targets._delta:DeltaGenerationTarget",
    "redis": "lakefold.projections.targets._redis:RedisGenerationTarget",
    "search": "lakefold.projections.targets._search:SearchGenerationTarget",
}


def target_class(kind: str) -> type[GenerationTarget]:
    """The ``GenerationTarget`` implementation of ``kind``."""
    module, name = TARGET_KINDS[kind].split(":")
    found: type[GenerationTarget] = getattr(importlib.import_module(module), name)
    return found


def open_target(spec: Target, location: str, context: TargetContext) -> GenerationTarget:
    """``spec``'s storage of one generation: its kind's implementation, built from the
    definition (each implementation takes ``(spec, location, context)``)."""
    build = cast("Callable[[Target, str, TargetContext], GenerationTarget]",
                 target_class(spec.kind))
    return build(spec, location, context)


def drop_generation_storage(locations: Mapping[str, str], context: TargetContext) -> None:
    """Delete a retired generation's storage of every kind (its target may have been of
    another kind than the projection's current one)."""
    for kind, location in locations.items():
        if kind in TARGET_KINDS:
            target_class(kind).drop_storage(location, context)


class TargetedProjection(ProjectionShape, Protocol):
    """A projection with its target, as the TRUNCATE policy (``_truncate``) reads it."""

    @property
    def target(self) -> Target: ...
