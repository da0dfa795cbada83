"""The protocol every view operator implements: the maintainer (``_view_maintainer``) drives
one batch through ``feed → apply → emit → commit`` in one store transaction, and knows nothing
else of the operator. Which operator maintains a view is the plan's tag
(``ViewPlan.operator``), decided once by the planner; an operator executes it and never decides
again.

- ``feed``: read what is new up to a cut of the inputs (events fed, the cut chosen); None when
  nothing is (the operator has recorded whatever it must about the empty batch);
- ``apply``: move the operator's state by the batch (input states, windows, folds) and find
  what it touched;
- ``emit``: the view's rows the batch changes, as upserts, their previous rows and deletes;
- ``commit``: append them to the output stream with the batch's progress.

``create`` and ``drop`` set up and delete what the operator keeps beyond the shared pieces
(``_view_core``), and ``compute`` is the whole view from the current state (a full recompute's
baseline, and the oracle of tests).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import psycopg
import pyarrow as pa

from lakefold.projections.plan._view_plan import Operator, ViewPlan

if TYPE_CHECKING:
    from lakefold.projections.operators._view_core import BatchResult, ViewCore


@dataclass(frozen=True)
class Emitted:
    """What a batch writes to the view's output stream: upserts, the previous row of each
    upsert (an empty row where there was none) and deletes."""

    upserts: pa.Table
    previous: pa.Table
    deletes: pa.Table


B = TypeVar("B")


class ViewOperator(ABC, Generic[B]):
    """Executes one tag of the plan, a batch (``B``) at a time (see the module docstring)."""

    #: The tag this operator executes.
    tag: ClassVar[Operator]

    def __init__(self, core: ViewCore) -> None:
        self.core = core

    @classmethod
    def stateless_input(cls, plan: ViewPlan) -> str | None:
        """An input whose rows this operator consumes without an input state (None: every
        input has one)."""
        return None

    def create(self, conn: psycopg.Connection[Any]) -> None:
        """Create what the operator keeps beyond the shared pieces (idempotent)."""

    def drop(self, conn: psycopg.Connection[Any]) -> None:
        """Delete what ``create`` created and the batches kept."""

    @abstractmethod
    def feed(self, conn: psycopg.Connection[Any], head: int) -> B | None:
        """Read what is new up to the cut (events final up to ``head``); None: nothing is."""

    @abstractmethod
    def apply(self, conn: psycopg.Connection[Any], batch: B) -> None:
        """Move the operator's state by ``batch`` and note what it touched."""

    @abstractmethod
    def emit(self, conn: psycopg.Connection[Any], batch: B) -> None:
        """Compute the view's rows ``batch`` changes (kept in the batch)."""

    @abstractmethod
    def commit(self, conn: psycopg.Connection[Any], batch: B) -> BatchResult:
        """Append what ``emit`` found to the output stream with the batch's progress."""

    @abstractmethod
    def compute(self, conn: psycopg.Connection[Any]) -> pa.Table:
        """The whole view from the current state."""
