"""Views under the runner: each view's live generation is kept up to date in this process, in
run order (a view after the views it reads), by its maintainer (inputs → output stream) and its
target writer (output stream → target).

A generation runs in one process at a time: the runner holds the generation's advisory lock
(the projections' lock namespace) on a connection of its own while it runs it; another runner
leaves it alone. A view whose step fails with a terminal error (a key that is not unique, a
query that fails on the data, an input whose compaction passed it) is marked ``failed`` in the
catalog with the error and left alone for the rest of the run, while every other view and
projection carries on; a transient error (the store unreachable) is tried again next tick.

**Rebuild.** ``lakefold rebuild X`` begins a new generation of X and of every view downstream of
it (``Runner.request_rebuild``). The runner that runs a view's live generation also runs its
new one, from the start of every input: a new generation reads the new generation of an
upstream view being rebuilt with it, and the live one of any other. A *group* (new generations
linked by what they read) switches in one catalog transaction once each of its members has
applied at least what its live generation has, and everything of the new upstream generations
it reads, and its target holds all of its output. Live and new generations step in this one
thread, so nothing moves between that check and the switch: readers see the old pair before
and the new pair after, never a new view over an old one, and no view goes back in time. The
retired generations' input states go at once, and with them their hold on compaction; their
targets' storage is kept as ``keep_generations`` says.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg

from lakefold.core.exceptions import LakefoldError, TerminalError, TransientError
from lakefold.projections.definitions._targets import TargetContext
from lakefold.projections.operators._changelog_windows import ChangelogWindowFeed
from lakefold.projections.operators._view_core import ViewGeneration, output_stream
from lakefold.projections.operators._view_events import store_head
from lakefold.projections.operators._view_maintainer import ViewMaintainer
from lakefold.projections.runtime._backoff import retry_delay
from lakefold.projections.runtime._run_report import ProjectionReport
from lakefold.projections.runtime._view_validation import CheckedView
from lakefold.projections.state._catalog import Catalog, Generation, hold_generation
from lakefold.projections.state._deadletters import DeadLetters, NewDeadLetter
from lakefold.projections.targets._view_targets import ViewTargetWriter
from lakefold.store import ChangelogStore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


@dataclass
class ViewProgress:
    """What a view did in this run."""

    batches: int = 0
    rows_written: int = 0
    #: Seconds spent bringing the target up to date (the rest of a step is the view's own
    #: batch: its output committed in the store).
    target_seconds: float = 0.0
    error: str | None = None
    last_step_moved: bool = False
    applied: dict[str, int] = field(default_factory=dict)


class ViewRun:
    """The live generation of one view, run by this process (see the module docstring)."""

    def __init__(self, spark: SparkSession, checked: CheckedView, *, catalog: Catalog,
                 generation: Generation, inputs: Mapping[str, str], store_dsn: str,
                 redis_url: str | None, namespace: str) -> None:
        view = checked.view
        self.name = view.name
        self.catalog = catalog
        self.dsn = store_dsn
        self.generation = generation.generation
        self.maintainer = ViewMaintainer(spark, store_dsn, ViewGeneration(
            view=view.name, generation=self.generation, inputs=inputs, query=view.query,
            plan=checked.plan, registry=view.registry, window=view.window,
            events={a: s.events for a, s in view.inputs.items() if s.events is not None},
            feed_limit=view.options.max_records_per_batch,
            live_generation=_live_generation(catalog, view.name, generation)))
        #: Input name → the stream it reads (a table's, a generation of another view's, or
        #: this generation's feed of events).
        self.inputs = dict(self.maintainer.inputs)
        try:
            self.maintainer.install(checked.output)
        except BaseException:
            self.maintainer.close()
            raise
        target = view.target.open(
            generation.location(view.target.kind),
            TargetContext(view.name, self.generation, redis_url=redis_url,
                          redis_namespace=namespace, null_keys=True))
        self.writer = ViewTargetWriter(store_dsn, self.maintainer.output.name, target,
                                       reader=f"{self.maintainer.owner}:target")
        self.progress = ViewProgress()
        #: Failures in a row of a transient error, and when to try again.
        self.failures = 0
        self.retry_at = 0.0
        self._lock: psycopg.Connection[Any] | None = None
        #: The next batch id this run notes in the catalog, and the applied position noted
        #: last (both read at the first step: see ``_record_batch``).
        self._batch_id: int | None = None
        self._recorded: dict[str, int] = {}

    def upstream_inputs(self) -> dict[str, str]:
        """The streams this generation reads that others write (not its own event feeds; of
        a windowed table, the table's stream its feed reads)."""
        feeds = self.maintainer.feeds
        return {k: v for k, v in self.inputs.items() if k not in feeds} | {
            k: f.source_stream for k, f in feeds.items() if isinstance(f, ChangelogWindowFeed)}

    def publish(self) -> None:
        """Point the target's readers at this generation (Redis readers follow a pointer)."""
        self.writer.target.publish()

    def applied(self) -> dict[str, int]:
        """Each input's first position the view has not applied yet (of an event input: the
        first global position of the event store, comparable between generations)."""
        conn = self.maintainer.connection()
        return {alias: state.position(conn) for alias, state in self.maintainer.states.items()
                } | {alias: feed.position(conn) for alias, feed in self.maintainer.feeds.items()}

    def holds(self, heads: Mapping[str, int], live: ViewRun) -> bool:
        """True when this (new) generation holds at least what ``live`` holds: of an input both
        read, as much as ``live`` has applied; of an input only this one reads (a new
        upstream generation), everything up to ``heads``; and its target holds all its
        output."""
        mine, theirs = self.applied(), live.applied()
        for name, stream in self.inputs.items():
            done = theirs.get(name, 1) if live.inputs.get(name) == stream or \
                name in self.maintainer.feeds else heads.get(stream, 0) + 1
            if mine[name] < done:
                return False
        return (self.writer.target.checkpoint() or 0) >= heads.get(self.writer.stream, 0)

    def acquire(self) -> bool:
        """Take the generation's lock (False: another process runs it)."""
        if self._lock is not None:
            return True
        self._lock = hold_generation(self.dsn, self.name, self.generation)
        return self._lock is not None

    def step(self) -> bool:
        """One batch of the view (noted in the catalog, see ``_record_batch``), then its
        target brought up to date; True when anything moved. Terminal errors mark the view
        failed and are raised; transient ones too (the caller retries)."""
        try:
            if self._batch_id is None:
                self._start_recording()
            batch = self.maintainer.step()
            moved = batch is not None
            if batch is not None:
                self.progress.batches += 1
                self.progress.applied = self.applied()  # an event input's: the store's
                self._dead_letters(batch.failed, batch.positions[1])
                self._record_batch(self.progress.applied)
            began = time.perf_counter()
            while (written := self.writer.step()) is not None:
                moved = True
                self.progress.rows_written += written.upserts + written.deletes
            self.progress.target_seconds += time.perf_counter() - began
        except TerminalError as e:
            self.progress.error = str(e).splitlines()[0]
            self.catalog.set_state(self.name, "failed", error=self.progress.error)
            log.error("view %s failed: %s", self.name, self.progress.error)
            raise
        except TransientError as e:
            self.progress.error = str(e).splitlines()[0]
            self.failures += 1
            delay = retry_delay(self.failures)
            self.retry_at = time.monotonic() + delay
            self.catalog.set_state(self.name, "retrying", error=self.progress.error)
            log.warning("view %s failed (attempt %d), retrying in %.1f s: %s", self.name,
                        self.failures, delay, self.progress.error)
            raise
        if self.failures:  # it got through: running again (the last error stays on record)
            self.failures = 0
            self.progress.error = None
            state = "rebuilding" if self.catalog.building(self.name) is not None else "running"
            self.catalog.set_state(self.name, state, keep_error=True)
        self.progress.last_step_moved = moved
        return moved

    def due(self) -> bool:
        """False while a failed step waits for its retry (``_backoff``)."""
        return time.monotonic() >= self.retry_at

    def _start_recording(self) -> None:
        """Where this run's batches start: after the generation's last batch in the catalog
        (this process holds the generation's lock, so it is the only one noting batches), from
        the positions the view has applied now."""
        noted = self.catalog.generation(self.name, self.generation).batch_id
        self._recorded = self.applied()
        self._batch_id = 0 if noted is None else noted + 1

    def _record_batch(self, applied: dict[str, int]) -> None:
        """Note a batch in the catalog as a projection's batch is noted (status' throughput,
        last batch and rebuild progress): its end position is each input's first position not
        applied (a projection generation's ``position``), its rows the positions it moved
        summed over the inputs."""
        assert self._batch_id is not None  # noqa: S101 - _start_recording ran first
        rows = sum(max(0, position - self._recorded.get(alias, 1))
                   for alias, position in applied.items())
        self.catalog.record_batch(self.name, self.generation, self._batch_id, applied, rows)
        self._batch_id += 1
        self._recorded = dict(applied)

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

    def retire(self) -> None:
        """Close, and delete what only this generation used: its input states and its own,
        and its durable readers (they no longer hold the compaction of their streams)."""
        self.maintainer.drop()
        self.close()
        with ChangelogStore(self.dsn) as store:
            store.release_reader(self.maintainer.owner)
            for feed in self.maintainer.feeds.values():
                for reader in feed.readers():
                    store.release_reader(reader)
            store.release_reader(self.writer.reader)


def _live_generation(catalog: Catalog, name: str, generation: Generation) -> int | None:
    """Of a generation being built: the live one, which it does not read past, unless that
    one failed (the rebuild is then the way out)."""
    if generation.status != "building":
        return None
    try:
        live = catalog.current(name)
    except LakefoldError:
        return None
    if live.generation == generation.generation or catalog.projection(name).state == "failed":
        return None
    return live.generation


class ViewRunner:
    """Every view of a registry, run in order (see the module docstring)."""

    def __init__(self, spark: SparkSession, checked: Mapping[str, CheckedView], *,
                 catalog: Catalog, store_dsn: str, redis_url: str | None, namespace: str,
                 drop: Callable[[Iterable[Generation]], None] = lambda dropped: None) -> None:
        self.spark = spark
        self.checked = dict(checked)
        self.catalog = catalog
        self.dsn = store_dsn
        self.redis_url = redis_url
        self.namespace = namespace
        #: Deletes the storage of generations a switch retired beyond ``keep_generations``.
        self.drop = drop
        self.runs: dict[str, ViewRun] = {}
        self.building: dict[str, ViewRun] = {}
        self.failed: set[str] = set()
        #: Every generation run of each view this runner opened, for the run's report.
        self.history: dict[str, list[ViewRun]] = {}

    def register(self) -> None:
        """Enter every view in the catalog (generation 1 when new)."""
        for name, checked in self.checked.items():
            view = checked.view
            self.catalog.ensure(name, target_kind=view.target.kind,
                                fingerprint=view.fingerprint(),
                                keep_generations=view.options.keep_generations,
                                definition=view.describe())

    def _open(self, name: str, generation: Generation, inputs: Mapping[str, str]) -> ViewRun:
        run = ViewRun(self.spark, self.checked[name], catalog=self.catalog,
                      generation=generation, inputs=inputs, store_dsn=self.dsn,
                      redis_url=self.redis_url, namespace=self.namespace)
        self.history.setdefault(name, []).append(run)
        return run

    def report(self, started: float, caught_up_at: float | None) -> list[ProjectionReport]:
        """What each view did in this run (see ``_run_report``): batches and output rows of
        every generation it ran, the live generation's applied position per input."""
        ended = time.monotonic()
        reports = []
        for name in self.checked:
            row = self.catalog.projection(name)
            live = self.catalog.current(name)
            runs = self.history.get(name, [])
            applied = next((r.progress.applied for r in reversed(runs)
                            if r.generation == live.generation), {})
            failed = row.state == "failed"
            reports.append(ProjectionReport(
                name=name, generation=live.generation,
                state="paused" if row.paused else row.state,
                caught_up=caught_up_at is not None and not row.paused and not failed,
                batches=sum(r.progress.batches for r in runs),
                records=sum(r.progress.rows_written for r in runs),
                position={alias: max(0, p - 1) for alias, p in applied.items()},
                seconds=round((caught_up_at or ended) - started, 3),
                error=row.last_error if failed else None))
        return reports

    def _inputs(self, name: str, *, new: bool) -> dict[str, str]:
        """The streams a generation of ``name`` reads: a new generation reads the new
        generation of an upstream view being rebuilt, anything else the live one."""
        streams = {}
        for alias, source in self.checked[name].view.inputs.items():
            if source.events is not None:
                continue  # fed by the generation itself (``_view_events``)
            if source.table is not None:
                streams[alias] = source.table
                continue
            upstream = str(source.view)
            generation = (self.catalog.building(upstream) if new else None) or \
                self.catalog.current(upstream)
            streams[alias] = output_stream(upstream, generation.generation)
        return streams

    def tick(self) -> bool:
        """Step every view once, in order, and its new generation after it while it is
        rebuilt; switch the rebuilt groups that caught up. True when none moved (all caught
        up, paused, or failed)."""
        quiet = True
        for name in self.checked:
            if name in self.failed:
                continue
            if self.catalog.projection(name).paused:
                self._stop(name)
                continue
            run = self.runs.get(name)
            if run is None:
                run = self.runs[name] = self._open(name, self.catalog.current(name),
                                                   self._inputs(name, new=False))
                if not run.acquire():
                    self._stop(name)
                    continue
                run.publish()
                self.catalog.set_state(name, "running")
            for step in (run, self._new_generation(name)):
                if step is None or not step.due():
                    continue
                try:
                    if step.step():
                        quiet = False
                except TerminalError:
                    self.failed.add(name)
                    self._stop(name)
                    break
                except TransientError:
                    pass  # tried again once its backoff is over
        self._switch_caught_up()
        return quiet and not self.building

    def _new_generation(self, name: str) -> ViewRun | None:
        """The run of the generation of ``name`` being built, if any (opened here)."""
        building = self.catalog.building(name)
        run = self.building.get(name)
        if building is None:
            if run is not None:  # abandoned (`lakefold rebuild --abandon`)
                self.building.pop(name).retire()
            return None
        inputs = self._inputs(name, new=True)
        if run is not None and run.generation == building.generation and \
                run.upstream_inputs() == inputs:
            return run
        if run is not None:
            self.building.pop(name).retire()
            if run.generation == building.generation:  # an upstream rebuild was abandoned
                self.catalog.abandon(name, building.generation)
                log.warning("view %s: generation %d read a new generation of a view that is "
                            "no longer being built; abandoned (rebuild it again)",
                            name, building.generation)
                return None
        run = self._open(name, building, inputs)
        if not run.acquire():
            run.close()
            return None
        self.building[name] = run
        self.catalog.set_state(name, "rebuilding")
        return run

    def _switch_caught_up(self) -> None:
        """Switch every group of new generations whose members all caught up (see the
        module docstring)."""
        if not self.building:
            return
        groups: list[set[str]] = []
        for name in self.building:  # in run order: upstream first
            linked = {u for u in self.checked[name].view.upstream if u in self.building}
            joined = [g for g in groups if g & linked]
            group = {name}.union(*joined)
            groups = [g for g in groups if g not in joined] + [group]
        with ChangelogStore(self.dsn) as store:
            heads = {s.name: s.head for s in store.streams()}
        for group in groups:
            if all(n in self.runs and self.building[n].holds(heads, self.runs[n])
                   for n in group):
                self._switch(group)

    def _switch(self, group: set[str]) -> None:
        dropped = self.catalog.switch_together(
            {name: self.building[name].generation for name in group})
        for name in [n for n in self.checked if n in group]:
            self.runs.pop(name).retire()
            run = self.runs[name] = self.building.pop(name)
            run.publish()
            self.catalog.set_state(name, "running")
            log.info("view %s switched to generation %d", name, run.generation)
        self.drop(dropped)

    def rebuilding(self) -> bool:
        """True while a view this runner runs has a new generation that has not switched."""
        return any(name in self.runs and self.catalog.building(name) is not None
                   for name in self.checked if name not in self.failed)

    def heads(self) -> dict[str, dict[str, int]]:
        """View → each captured table it reads → that stream's head now, and each event input
        → the event store's head (the views are caught up when they have applied these and a
        tick moves nothing)."""
        events = store_head(self.dsn) if any(
            s.events is not None for c in self.checked.values() for s in c.view.inputs.values()
        ) else 0
        with ChangelogStore(self.dsn) as store:
            return {name: {alias: store.head(str(source.table)) if source.table is not None
                           else events
                           for alias, source in checked.view.inputs.items()
                           if source.view is None}
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
        for runs in (self.runs, self.building):
            run = runs.pop(name, None)
            if run is not None:
                run.close()

    def close(self) -> None:
        """Stop every view this runner runs; they are left ``stopped`` in the catalog."""
        for name in list(self.runs):
            self._stop(name)
            if self.catalog.projection(name).state in ("running", "rebuilding"):
                self.catalog.set_state(name, "stopped", keep_error=True)
        for name in list(self.building):
            self._stop(name)
