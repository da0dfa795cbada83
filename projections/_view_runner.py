"""Views under the runner: each view's live generation is kept up to date in this process, in
run order (a view after the views it reads), by its maintainer (inputs → output stream) and its
target writer (output stream → target).

A generation runs in one process at a time: the runner holds the generation's advisory lock
(the projections' lock namespace) on a connection of its own while it runs it; another runner
leaves it alone. A view whose step fails with a terminal error (a key that is not unique, a
query that fails on the data, an input whose compaction passed it) is marked ``failed`` in the
catalog with the error and left alone for the rest of the run, while every other view and
projection carries on; a transient error (the store unreachable) is tried again next tick.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg

from lakefold.core.exceptions import TerminalError, TransientError
from lakefold.projections._catalog import Catalog, hold_generation
from lakefold.projections._deadletters import DeadLetters, NewDeadLetter
from lakefold.projections._targets import TargetContext
from lakefold.projections._view_maintainer import ViewMaintainer, output_stream
from lakefold.projections._view_targets import ViewTargetWriter
from lakefold.projections._view_validation import CheckedView

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


@dataclass
class ViewProgress:
    """What a view did in this run."""

    batches: int = 0
    rows_written: int = 0
    error: str | None = None
    last_step_moved: bool = False
    applied: dict[str, int] = field(default_factory=dict)


class ViewRun:
    """The live generation of one view, run by this process (see the module docstring)."""

    def __init__(self, spark: SparkSession, checked: CheckedView, *, catalog: Catalog,
                 store_dsn: str, redis_url: str | None, namespace: str) -> None:
        view = checked.view
        self.name = view.name
        self.catalog = catalog
        self.dsn = store_dsn
        generation = catalog.current(view.name)
        self.generation = generation.generation
        inputs = {alias: source.table if source.table is not None else
                  output_stream(str(source.view), catalog.current(str(source.view)).generation)
                  for alias, source in view.inputs.items()}
        self.maintainer = ViewMaintainer(spark, store_dsn, view=view.name,
                                         generation=self.generation, inputs=inputs,
                                         query=view.query, plan=checked.plan)
        self.maintainer.install(checked.output)
        target = view.target.open(
            generation.location(view.target.kind),
            TargetContext(view.name, self.generation, redis_url=redis_url,
                          redis_namespace=namespace))
        self.writer = ViewTargetWriter(store_dsn, self.maintainer.output.name, target,
                                       reader=f"{self.maintainer.owner}:target")
        self.progress = ViewProgress()
        self._lock: psycopg.Connection[Any] | None = None

    def publish(self) -> None:
        """Point the target's readers at this generation (Redis readers follow a pointer)."""
        self.writer.target.publish()

    def applied(self) -> dict[str, int]:
        """Each input's first position the view has not applied yet."""
        conn = self.maintainer.connection()
        return {alias: state.position(conn) for alias, state in self.maintainer.states.items()}

    def acquire(self) -> bool:
        """Take the generation's lock (False: another process runs it)."""
        if self._lock is not None:
            return True
        self._lock = hold_generation(self.dsn, self.name, self.generation)
        return self._lock is not None

    def step(self) -> bool:
        """One batch of the view, then its target brought up to date; True when anything
        moved. Terminal errors mark the view failed and are raised; transient ones too (the
        caller retries)."""
        try:
            batch = self.maintainer.step()
            moved = batch is not None
            if batch is not None:
                self.progress.batches += 1
                self.progress.applied = dict(batch.ends)
                self._dead_letters(batch.failed, batch.positions[1])
            while (written := self.writer.step()) is not None:
                moved = True
                self.progress.rows_written += written.upserts + written.deletes
        except TerminalError as e:
            self.progress.error = str(e).splitlines()[0]
            self.catalog.set_state(self.name, "failed", error=self.progress.error)
            log.error("view %s failed: %s", self.name, self.progress.error)
            raise
        except TransientError as e:
            self.progress.error = str(e).splitlines()[0]
            self.catalog.set_state(self.name, "retrying", error=self.progress.error)
            log.warning("view %s will retry: %s", self.name, self.progress.error)
            raise
        self.progress.last_step_moved = moved
        return moved

    def _dead_letters(self, failed: tuple[tuple[dict[str, str | None], str], ...],
                      position: int) -> None:
        """Record the partitions the query failed on (left as they were; a later change to
        one recomputes it)."""
        if not failed:
            return
        letters = [NewDeadLetter(ref="partition:" + json.dumps(partition, sort_keys=True),
                                 stage="view", source=self.name, position=position,
                                 record={"partition": partition}, error=error, attempts=1)
                   for partition, error in failed]
        DeadLetters(self.catalog).add(self.name, self.generation, letters)
        log.warning("view %s: the query failed on %d partition(s), left as they were: %s",
                    self.name, len(letters), failed[0][1])

    def close(self) -> None:
        self.maintainer.close()
        self.writer.close()
        self.writer.target.close()
        if self._lock is not None:
            self._lock.close()
            self._lock = None


class ViewRunner:
    """Every view of a registry, run in order (see the module docstring)."""

    def __init__(self, spark: SparkSession, checked: Mapping[str, CheckedView], *,
                 catalog: Catalog, store_dsn: str, redis_url: str | None,
                 namespace: str) -> None:
        self.spark = spark
        self.checked = dict(checked)
        self.catalog = catalog
        self.dsn = store_dsn
        self.redis_url = redis_url
        self.namespace = namespace
        self.runs: dict[str, ViewRun] = {}
        self.failed: set[str] = set()

    def register(self) -> None:
        """Enter every view in the catalog (generation 1 when new)."""
        for name, checked in self.checked.items():
            view = checked.view
            self.catalog.ensure(name, target_kind=view.target.kind,
                                fingerprint=view.fingerprint(),
                                keep_generations=view.options.keep_generations,
                                definition=view.describe())

    def tick(self) -> bool:
        """Step every view once, in order; True when none moved (all caught up, paused, or
        failed)."""
        quiet = True
        for name in self.checked:
            if name in self.failed:
                continue
            if self.catalog.projection(name).paused:
                self._stop(name)
                continue
            run = self.runs.get(name)
            if run is None:
                run = self.runs[name] = ViewRun(
                    self.spark, self.checked[name], catalog=self.catalog, store_dsn=self.dsn,
                    redis_url=self.redis_url, namespace=self.namespace)
                if not run.acquire():
                    self._stop(name)
                    continue
                run.publish()
                self.catalog.set_state(name, "running")
            try:
                if run.step():
                    quiet = False
            except TerminalError:
                self.failed.add(name)
                self._stop(name)
            except TransientError:
                quiet = False
        return quiet

    def heads(self) -> dict[str, dict[str, int]]:
        """View → each captured table it reads → that stream's head now (the views are caught
        up when they have applied these and a tick moves nothing)."""
        from lakefold.capture.store import ChangelogStore

        with ChangelogStore(self.dsn) as store:
            return {name: {alias: store.head(str(source.table))
                           for alias, source in checked.view.inputs.items()
                           if source.table is not None}
                    for name, checked in self.checked.items()}

    def caught_up(self, heads: Mapping[str, Mapping[str, int]]) -> bool:
        """Every running view has applied ``heads`` (see ``heads``); failed, paused and
        elsewhere-run views count as done."""
        for name, tables in heads.items():
            run = self.runs.get(name)
            if run is None:
                continue
            applied = run.applied()
            if any(applied.get(alias, 1) <= head for alias, head in tables.items()):
                return False
        return True

    def _stop(self, name: str) -> None:
        run = self.runs.pop(name, None)
        if run is not None:
            run.close()

    def close(self) -> None:
        """Stop every view this runner runs; they are left ``stopped`` in the catalog."""
        for name in list(self.runs):
            self._stop(name)
            if self.catalog.projection(name).state == "running":
                self.catalog.set_state(name, "stopped", keep_error=True)
