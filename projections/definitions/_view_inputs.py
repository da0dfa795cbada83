"""What a view reads beside captured tables, as a user writes it: ``events(...)`` inputs
(``EventInput``), ``lookup(...)`` of a captured table's row as of an event's place in commit
order, and ``interval_join(...)`` of two event inputs within a time bound. The operators that
execute them live in ``operators`` (``_view_events``, ``_lookups``) and the join's bounds are
read off the plan in ``plan._join_bounds``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

import numpy as np

from lakefold.projections.definitions._model import check_name
from lakefold.projections.definitions._windows import duration, micros
from lakefold.projections.exceptions import ProjectionDefinitionError
from lakefold.spark.internals import ChangelogSource


@dataclass(frozen=True)
class IntervalJoin:
    """A join of two event inputs within a time bound (see the module docstring)."""

    left: str
    left_time: str
    right: str
    right_time: str
    lateness: timedelta
    #: ``lower <= right time - left time <= upper``, in microseconds (read off the query).
    lower_us: int | None = None
    upper_us: int | None = None
    #: True for a left outer join (a left event's rows are written once final).
    outer: bool = False

    @property
    def lateness_us(self) -> int:
        return micros(self.lateness)

    def describe(self) -> dict[str, object]:
        return {"left": f"{self.left}.{self.left_time}",
                "right": f"{self.right}.{self.right_time}",
                "lateness": self.lateness.total_seconds()}

    @property
    def bounds(self) -> tuple[int, int]:
        assert self.lower_us is not None and self.upper_us is not None  # noqa: S101
        return self.lower_us, self.upper_us

    def classify(self, is_left: np.ndarray, times: np.ndarray, max_before: int | None
                 ) -> tuple[np.ndarray, np.ndarray, int | None]:
        """For the batch's events of both inputs in commit order (``is_left``: of the left
        input; ``times``: int64 microseconds, ``np.iinfo(np.int64).min`` for none): which are
        late, the watermark each came behind, and the largest event time after them all."""
        upper = self.bounds[1]
        floor = np.iinfo(np.int64).min
        running = np.maximum.accumulate(times) if len(times) else times
        if max_before is not None:
            running = np.maximum(running, max_before)
        watermark = running - self.lateness_us
        reach = np.where(is_left, times + upper, times)  # what the watermark must not pass
        late = (running != floor) & (times != floor) & (reach < watermark)
        top = int(running[-1]) if len(running) and running[-1] != floor else max_before
        return late, watermark, top

    def forget_left(self, times: np.ndarray, watermark: int) -> np.ndarray:
        """Which kept left events no right event can join any more (and are final)."""
        return times + self.bounds[1] < watermark

    def forget_right(self, times: np.ndarray, watermark: int) -> np.ndarray:
        """Which kept right events no kept or future left event can join."""
        lower, upper = self.bounds
        return times - lower + upper < watermark


def interval_join(*, left: str, right: str, lateness: str | timedelta = "0s"
                  ) -> IntervalJoin:
    """A join of two event inputs within a time bound stated in the query (see the module
    docstring): ``left`` and ``right`` name each input's time column as 'input.column'."""
    sides = []
    for what, on in (("left", left), ("right", right)):
        if not isinstance(on, str) or on.count(".") != 1 or not all(on.split(".")):
            raise ProjectionDefinitionError(
                f"interval_join({what}={on!r}): name the input and its time column as "
                "'input.column' (e.g. 'searches.occurred_at')")
        sides.append(on.split("."))
    if sides[0][0] == sides[1][0]:
        raise ProjectionDefinitionError(
            f"interval_join: left and right are both input {sides[0][0]!r}; join two inputs "
            "(make a second input of the same events)")
    return IntervalJoin(sides[0][0], sides[0][1], sides[1][0], sides[1][1],
                        duration("interval join allowed lateness", lateness, zero=True))


@dataclass(frozen=True)
class Lookup:
    """A lookup of a captured table's row for each event of an input (see the module
    docstring): ``on`` are the event columns matching the table's key columns, in order;
    ``columns`` the (table column, output column) pairs added (empty: every non-key column
    under its own name)."""

    table: str
    on: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]
    as_of: str = "commit"

    def describe(self) -> dict[str, Any]:
        return {"table": self.table, "on": list(self.on),
                "columns": [list(c) for c in self.columns], "as_of": self.as_of}


def lookup(table: str | ChangelogSource, *, on: str | Sequence[str],
           columns: Sequence[str] | Mapping[str, str] | None = None,
           as_of: str = "commit") -> Lookup:
    """A lookup of ``table``'s row (a captured ``schema.table``) for each event, as of the
    event's commit (``as_of="commit"``) or as of when the event is fed (``"latest"``, not
    replay-stable); see the module docstring."""
    name = table.table if isinstance(table, ChangelogSource) else table
    if not isinstance(name, str) or not name:
        raise ProjectionDefinitionError(
            f"lookup({table!r}): give a captured table as 'schema.table' or changelog(...)")
    keys = (on,) if isinstance(on, str) else tuple(on)
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise ProjectionDefinitionError(
            f"lookup({name!r}): on= names the event columns that hold the table's primary "
            "key, in the key's column order")
    if as_of not in AS_OF:
        raise ProjectionDefinitionError(
            f"lookup({name!r}): as_of={as_of!r}; use 'commit' (the row when the event "
            "committed: replays give the same rows) or 'latest' (the row when the event is "
            "fed: not replay-stable)")
    pairs: tuple[tuple[str, str], ...]
    if columns is None:
        pairs = ()
    elif isinstance(columns, Mapping):
        pairs = tuple((str(k), str(v)) for k, v in columns.items())
    elif isinstance(columns, str) or not columns:
        raise ProjectionDefinitionError(
            f"lookup({name!r}): columns= is a list of the table's columns, or a mapping "
            "from them to output names")
    else:
        pairs = tuple((str(c), str(c)) for c in columns)
    for _, out in pairs:
        check_name(f"lookup({name!r})'s output column", out)
    return Lookup(name, keys, pairs, as_of)


@dataclass(frozen=True)
class EventInput:
    """What a view's event input reads: a category (None: all) and types (empty: all)."""

    category: str | None
    types: tuple[str, ...]
    #: Tables' rows added to each event as of its commit (``_lookups``).
    lookups: tuple[Lookup, ...] = ()

    @property
    def label(self) -> str:
        what = f"events of category {self.category}" if self.category else "all events"
        return what + (f" of types {', '.join(self.types)}" if self.types else "")


#: The modes of ``lookup``'s ``as_of``.
AS_OF: Final = ("commit", "latest")
