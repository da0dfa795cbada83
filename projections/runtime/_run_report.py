"""What one ``Runner.run`` did, projection by projection: the batches and records its queries
committed, where the live generation stands, how long it took, and the state it was left in.

The runner notes each sink it starts and when each projection caught up; ``report`` reads the
positions and states from the catalog once the queries have stopped, so they are final.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakefold.projections.definitions._api import Projection
    from lakefold.projections.runtime._batch import GenerationSink
    from lakefold.projections.state._catalog import Catalog

#: The states a runner writes while it runs a projection; at a clean exit they become
#: ``stopped`` (``paused`` and ``failed`` stay: they say something the next run must know).
RUNNING_STATES = ("running", "rebuilding", "retrying")


@dataclass(frozen=True)
class ProjectionReport:
    """One projection in one run. ``batches`` and ``records`` count what this run committed
    (every generation it ran); ``position`` is the live generation's last processed position
    per source (0: nothing yet); ``seconds`` runs from the start of the run until the
    projection was caught up (``caught_up``), or until the run ended; ``state`` is its
    catalog state afterwards, ``error`` its error when that is ``failed``."""

    name: str
    generation: int
    state: str
    caught_up: bool
    batches: int
    records: int
    position: dict[str, int]
    seconds: float
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RunTally:
    """The runner's notes during one run (see the module docstring)."""

    started: float = field(default_factory=time.monotonic)
    sinks: dict[str, list[GenerationSink]] = field(default_factory=dict)
    caught_up_at: dict[str, float] = field(default_factory=dict)

    def add_sink(self, name: str, sink: GenerationSink) -> None:
        self.sinks.setdefault(name, []).append(sink)

    def caught_up(self, name: str) -> None:
        """Note the first moment ``name`` was caught up (later calls change nothing)."""
        self.caught_up_at.setdefault(name, time.monotonic())

    def report(self, catalog: Catalog, projections: Sequence[Projection]
               ) -> list[ProjectionReport]:
        """The report of every projection in ``projections``, read after the queries
        stopped."""
        ended = time.monotonic()
        reports = []
        for projection in projections:
            name = projection.name
            row = catalog.projection(name)
            live = catalog.current(name)
            with_progress = [sink.progress for sink in self.sinks.get(name, [])]
            reports.append(ProjectionReport(
                name=name, generation=live.generation,
                state="paused" if row.paused else row.state,
                caught_up=(name in self.caught_up_at and not row.paused
                           and row.state != "failed"),
                batches=sum(p.batches for p in with_progress),
                records=sum(p.records for p in with_progress),
                position={s.alias: max(0, live.position.get(s.alias, 0) - 1)
                          for s in projection.sources},
                seconds=round(self.caught_up_at.get(name, ended) - self.started, 3),
                error=row.last_error if row.state == "failed" else None,
            ))
        return reports
