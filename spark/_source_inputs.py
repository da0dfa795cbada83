"""What a reader reads: the description of one input of the source layer.

An input is the changelog stream of one captured table (``ChangelogSource``), some events of
the event store (``EventSource``: one category or all, optionally some event types), or the
versions of a Delta table (``DeltaSource``, read as change rows: ``_source_delta``). Each has
an ``alias``, the name its reader gives it (a projection's transform keyword, a fold record's
``source``). Inputs are frozen dataclasses: they pickle to Spark's Python workers and travel
as the ``source`` option of the record sources in JSON (``source_to_json``).

Projections build them with ``lakefold.projections.changelog()`` / ``events()`` /
``delta_changes()``, which validate names; the source layer only reads them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Literal


@dataclass(frozen=True)
class ChangelogSource:
    """The changelog stream of one captured table (``schema.table``; ``public`` by default)."""

    table: str
    alias: str

    @property
    def kind(self) -> Literal["changelog"]:
        return "changelog"

    @property
    def label(self) -> str:
        return f"changelog {self.table}"


@dataclass(frozen=True)
class EventSource:
    """Events of one category (None: every category), optionally only some event types."""

    category: str | None
    types: tuple[str, ...]
    alias: str
    #: The types given as event classes (known to the code even before the store has any).
    declared: tuple[str, ...] = ()

    @property
    def kind(self) -> Literal["events"]:
        return "events"

    @property
    def label(self) -> str:
        what = f"category {self.category}" if self.category else "all categories"
        return f"events of {what}" + (f" of types {', '.join(self.types)}" if self.types else "")


@dataclass(frozen=True)
class DeltaSource:
    """The committed versions of a Delta table (a local path or an ``s3://`` URI) as change
    rows, each identified by the ``key`` columns; from ``starting_version`` (the table as of
    that version, then its changes) or from version 0."""

    uri: str
    key: tuple[str, ...]
    alias: str
    starting_version: int | None = None

    @property
    def kind(self) -> Literal["delta"]:
        return "delta"

    @property
    def label(self) -> str:
        return f"delta table {self.uri}"


Source = ChangelogSource | EventSource | DeltaSource


def source_to_json(source: Source) -> str:
    """The ``source`` option of a record source (``kind`` plus the dataclass fields)."""
    return json.dumps({"kind": source.kind, **asdict(source)})


def source_from_json(text: str) -> Source:
    """The input a ``source`` option describes (see ``source_to_json``)."""
    data = json.loads(text)
    kind = data.pop("kind")
    if kind == "events":
        return EventSource(category=data["category"], types=tuple(data["types"]),
                           alias=data["alias"], declared=tuple(data.get("declared", ())))
    if kind == "delta":
        start = data.get("starting_version")
        return DeltaSource(uri=data["uri"], key=tuple(data["key"]), alias=data["alias"],
                           starting_version=int(start) if start is not None else None)
    return ChangelogSource(table=data["table"], alias=data["alias"])
