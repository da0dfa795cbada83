"""The runner: keeps every registered projection's live generation running as a Spark
streaming query, builds requested generations beside it and switches to them, honours pause
and resume, and retries failed queries with backoff.

One query per (projection, generation), each with its own Spark checkpoint directory and its
own target locations. A PostgreSQL advisory lock per (projection, generation), held on its own
connection while the query runs, makes sure that two runner processes never run the same
generation (the second one leaves it alone); the lock goes away with the process, even on
SIGKILL. A query that failed and waits for its retry keeps the lock (the runner still owns the
generation: ``lakefold status`` says ``retrying``, not ``stopped``); the query that restarts it
takes it over, and it is released when the projection fails for good, is paused, or the
runner stops. A store that goes away (a restart, a network cut) does not end a run: it waits
with the same backoff (``_backoff``) and goes on where its queries' checkpoints say.

Rebuild (``Catalog.begin_rebuild``; ``lakefold rebuild NAME``): generation N+1 replays from
position 0 in batches of ``rebuild_records_per_batch`` while generation N stays live. When
N+1's committed position has reached N's for every source, the catalog switches NAME to N+1
in one transaction, Redis readers' pointer follows, N's query stops, and generations beyond
``keep_generations`` are dropped (the storage of every target kind, and the checkpoint). N+1's query
simply carries on as the live one: readers never see an empty or half-built view.

Compaction: every running or building generation holds its positions in the changelog streams
it reads, so compaction never passes it (``_readers``). A live generation that compaction
passed anyway fails with the fix (``lakefold rebuild NAME``) and waits for its rebuild's
switch; a rebuild that would not give the history a Delta scd2/append view holds is refused.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg

from lakefold.core.exceptions import LakefoldError, TransientError, marker_in
from lakefold.projections.definitions._api import Projection, Registry
from lakefold.projections.definitions._targets import TargetContext, drop_generation_storage
from lakefold.projections.definitions._view_api import View, downstream_of
from lakefold.projections.exceptions import (
    BehindCompactionError,
    ProjectionNotFoundError,
    ProjectionStateError,
    ProjectionTimeoutError,
)
from lakefold.projections.runtime._backoff import retry_delay
from lakefold.projections.runtime._batch import GenerationSink
from lakefold.projections.runtime._queries import Plan, build, validate
from lakefold.projections.runtime._rebuild_request import request_rebuild
from lakefold.projections.runtime._retry_source import retry_frame
from lakefold.projections.runtime._run_report import RUNNING_STATES, ProjectionReport, RunTally
from lakefold.projections.runtime._targeted import PartReport, rebuild_part
from lakefold.projections.runtime._view_runner import ViewRunner
from lakefold.projections.runtime._view_validation import plan_views
from lakefold.projections.state._catalog import (
    Catalog,
    Generation,
    SinkRoots,
    hold_generation,
    still_holds,
)
from lakefold.projections.state._deadletters import DeadLetters
from lakefold.projections.state._readers import (
    committed_positions,
    keep_history_for,
    release_gone,
    remove_checkpoint,
)
from lakefold.spark.internals import FoldKeys, source_reads

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)


#: Spark settings for a runner's session (on top of lakefold.spark's defaults).
#: Every micro-batch writes two checkpoint files (the offset log before it runs, the commit
#: log after). The default manager goes through Hadoop's FileContext API, which took 50-185
#: ms per file here; the FileSystem-based one takes 10-20 ms. Both write a temporary file
#: and rename it into place (refusing to overwrite a batch file), so a crash leaves either
#: the whole file or none, and recovery is the same (tests/projections/test_crash.py).
#: Local paths (``file:``) go through Hadoop's raw local file system, which writes no ``.crc``
#: sidecar per file (the default local one writes, renames and deletes each file twice):
#: 15-18 ms instead of 23-34 ms per log write in an isolated trial (three queries, load 7-12).
#: Nothing of lakefold's reads those checksums (Delta files are written by delta-rs, without).
RUNNER_SPARK_CONF = {
    "spark.sql.streaming.checkpointFileManagerClass":
        "org.apache.spark.sql.execution.streaming.checkpointing."
        "FileSystemBasedCheckpointFileManager",
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
}


@dataclass(frozen=True)
class RunnerConfig:
    """Where the runner reads and writes. ``trigger_seconds`` overrides every projection's
    processing-time trigger; ``only`` limits the runner to some projections."""

    store_dsn: str
    roots: SinkRoots
    redis_url: str | None = None
    poll_seconds: float = 0.5
    trigger_seconds: float | None = None
    only: tuple[str, ...] = ()


class GenerationQuery:
    """One generation of one projection, running as a streaming query in this process."""

    def __init__(self, runner: Runner, projection: Projection, generation: Generation, *,
                 role: str, lock: psycopg.Connection[Any] | None = None) -> None:
        """``lock``: the generation's lock, handed over by the query this one restarts
        (``take_lock``)."""
        self.runner = runner
        self.projection = projection
        self.generation = generation
        self.role = role
        self.query: StreamingQuery | None = None
        self.sink: GenerationSink | None = None
        self._lock_conn: psycopg.Connection[Any] | None = lock

    @property
    def key(self) -> tuple[str, int]:
        return (self.projection.name, self.generation.generation)

    def _acquire(self) -> bool:
        """Take the generation's advisory lock on a connection of its own, kept open (and
        closed by ``_release``) while the query runs; closed at once when not taken. A lock
        handed over is kept while its connection still holds it, else taken again (its
        session ended meanwhile, and the lock with it)."""
        if self._lock_conn is not None and not still_holds(self._lock_conn, *self.key):
            log.warning("projection %s: the lock of generation %d was lost while its query "
                        "waited to be retried; taking it again", *self.key)
            self._release()
        if self._lock_conn is None:
            self._lock_conn = hold_generation(self.runner.config.store_dsn, *self.key)
        return self._lock_conn is not None

    def take_lock(self) -> psycopg.Connection[Any] | None:
        """Hand the generation's lock over (to the runner, which holds it while the query
        waits to be retried); ``stop`` then no longer releases it."""
        conn, self._lock_conn = self._lock_conn, None
        return conn

    def start(self) -> bool:
        """Start the query; False when another process is running this generation. When
        starting fails, what ``_start`` opened is closed but the lock is kept (``take_lock``
        hands it to the retry; ``stop`` releases it)."""
        if not self._acquire():
            return False
        try:
            self._start()
        except Exception:
            self._stop_query()
            raise
        except BaseException:
            self.stop()
            raise
        return True

    def _start(self) -> None:
        runner, projection, generation = self.runner, self.projection, self.generation
        options = projection.options
        max_records = options.rebuild_records_per_batch if self.role == "rebuild" \
            else options.max_records_per_batch
        plan = runner.take_prepared_plan(projection.name, generation.generation, self.role)
        if plan is None:
            plan = runner.plan(projection, generation.generation, max_records=max_records,
                               rebuild=self.role == "rebuild")
        from pyspark.sql.pandas.types import to_arrow_schema

        self.sink = GenerationSink(
            projection, generation, catalog=runner.catalog, dead_letters=runner.dead_letters,
            redis_url=runner.config.redis_url, namespace=runner.config.roots.redis_namespace,
            output_schema=to_arrow_schema(plan.output.schema, timezone="UTC"))
        self.sink.progress.end = dict(generation.position)
        # Hold the changelog positions the query resumes from, before it reads anything.
        self.sink.reads.attach(committed_positions(generation.checkpoint_dir))
        runner.tally.add_sink(projection.name, self.sink)
        if self.role == "live":
            self.sink.publish()
        trigger = runner.config.trigger_seconds
        if trigger is None:
            trigger = options.trigger_seconds
        self.query = (plan.output.writeStream
                      .foreachBatch(self.sink)
                      .outputMode("update")
                      .option("checkpointLocation", generation.checkpoint_dir)
                      .queryName(f"{projection.name}_g{generation.generation}")
                      .trigger(processingTime=f"{int(trigger * 1000)} milliseconds")
                      .start())

    def _release(self) -> None:
        if self._lock_conn is not None:
            self._lock_conn.close()
            self._lock_conn = None

    def _stop_query(self) -> None:
        """Stop the query and close its sink (the lock stays)."""
        try:
            if self.query is not None:
                try:
                    self.query.stop()
                except Exception as e:
                    log.warning("stopping %s failed: %s", self.query.name, e)
        finally:
            if self.sink is not None:
                self.sink.close()

    def stop(self) -> None:
        """Stop the query, close its sink and release the generation's lock."""
        try:
            self._stop_query()
        finally:
            self._release()

    @property
    def active(self) -> bool:
        return self.query is not None and self.query.isActive

    def failure(self) -> BaseException | None:
        """The error that stopped the query (the original one when it came from our sink)."""
        if self.query is None or self.query.isActive:
            return None
        if self.sink is not None and self.sink.progress.error is not None:
            return self.sink.progress.error
        return self.query.exception()

    def end(self, *, pending: bool = False) -> dict[str, int]:
        """The end position of the last committed batch; with ``pending``, of the last batch
        whose writes started (they may be visible although the batch did not finish)."""
        if self.sink is None:
            return dict(self.generation.position)
        with self.sink.progress.lock:
            end = dict(self.sink.progress.end)
            if pending:
                for alias, position in self.sink.progress.pending.items():
                    end[alias] = max(end.get(alias, 0), position)
            return end


@dataclass
class _Health:
    failures: int = 0
    retry_at: float = 0.0
    given_up: bool = False
    last_error: str | None = None
    remote: set[int] = field(default_factory=set)
    #: Live generations behind compaction, waiting for the rebuild that replaces them.
    behind: set[int] = field(default_factory=set)


class Runner:
    """Runs the projections of a registry (see the module docstring). It holds a catalog
    connection: use it as a context manager, or call ``close``."""

    def __init__(self, spark: SparkSession, registry: Registry, config: RunnerConfig) -> None:
        self.spark = spark
        self.registry = registry
        self.config = config
        self.catalog = Catalog(config.store_dsn, config.roots)
        self.dead_letters = DeadLetters(self.catalog)
        self.queries: dict[tuple[str, int], GenerationQuery] = {}
        #: The locks of generations whose query failed and waits for its retry (see the
        #: module docstring), by (projection, generation).
        self._held: dict[tuple[str, int], psycopg.Connection[Any]] = {}
        self._health: dict[str, _Health] = {}
        self._switching: dict[str, dict[str, int]] = {}
        self._plans: dict[tuple[str, int], Plan] = {}
        self._prepared = False
        self.tally = RunTally()  # what the current (or last) ``run`` did
        self.views: ViewRunner | None = None
        #: Views left out at the start: an input's schema changed under them (see prepare).
        self.drifted: set[str] = set()

    @property
    def projections(self) -> list[Projection]:
        selected = [p for p in self.registry
                    if not self.config.only or p.name in self.config.only]
        unknown = set(self.config.only) - {p.name for p in selected} - set(self.registry.views)
        if unknown:
            self.registry.get(sorted(unknown)[0])  # raises ProjectionNotFoundError, listing names
        return selected

    def plan(self, projection: Projection, generation: int, *, max_records: int,
             rebuild: bool = False) -> Plan:
        """The output plan of one generation of ``projection`` (not started); ``rebuild``: a
        rebuild's full replay (see ``_plan.build``)."""
        retries = None
        if projection.fold is not None:
            retries = retry_frame(self.spark, self.config.store_dsn, projection.name,
                                  generation)
        return build(self.spark, projection, self.config.store_dsn, max_records=max_records,
                     retries=retries, rebuild=rebuild, generation=generation)

    def take_prepared_plan(self, name: str, generation: int, role: str) -> Plan | None:
        """The plan ``prepare`` validated for the live generation (used once)."""
        return self._plans.pop((name, generation), None) if role == "live" else None

    def prepare(self) -> None:
        """Install the catalog, validate every projection against the live stores, and
        register new projections (generation 1). Raises before anything runs.

        The plans validated here are the ones the live queries start with (building a plan
        starts Python processes for its sources, so it is done once)."""
        if self._prepared:
            return
        self.catalog.install()
        self.dead_letters.install()
        selected = Registry()
        live: dict[str, int] = {}
        for projection in self.projections:
            selected._projections[projection.name] = projection
            try:
                live[projection.name] = self.catalog.current(projection.name).generation
            except ProjectionNotFoundError:
                live[projection.name] = 1

        def factory(projection: Projection) -> Plan:
            return self.plan(projection, live[projection.name],
                             max_records=projection.options.max_records_per_batch)

        plans = validate(self.spark, selected, self.config.store_dsn, factory)
        self._plans = {(name, live[name]): plan for name, plan in plans.items()}
        for projection in self.projections:
            self.catalog.ensure(projection.name, target_kind=projection.target.kind,
                                fingerprint=projection.fingerprint(),
                                keep_generations=projection.options.keep_generations,
                                definition=projection.describe())
            keep_history_for(self.config.store_dsn, projection)
        release_gone(self.config.store_dsn, self.catalog)
        views = self.registry.views
        selected_views = set(views) if not self.config.only else {
            name for chosen in self.config.only if chosen in views
            for name in (chosen, *downstream_of(views, chosen))}
        if selected_views:
            checked = plan_views(self.spark, views, self.config.store_dsn,
                                 others=tuple(self.registry.names()),
                                 established=self._established(views),
                                 on_drift=self._drifted)
            self.views = ViewRunner(self.spark, {n: c for n, c in checked.items()
                                                 if n in selected_views},
                                    catalog=self.catalog, store_dsn=self.config.store_dsn,
                                    redis_url=self.config.redis_url,
                                    namespace=self.config.roots.redis_namespace,
                                    drop=self.drop_generations)
            self.views.register()
        self._prepared = True

    def _established(self, views: Mapping[str, View]) -> set[str]:
        """The views that ran before with their definition as it is now."""
        out = set()
        for name, view in views.items():
            try:
                row = self.catalog.projection(name)
            except ProjectionNotFoundError:
                continue
            if row.fingerprint == view.fingerprint():
                out.add(name)
        return out

    def _drifted(self, name: str, message: str) -> None:
        """A view that no longer fits its inputs: failed, with why; the others run."""
        log.error("%s", message)
        self.catalog.set_state(name, "failed", error=message)
        self.drifted.add(name)

    # ------------------------------------------------------------------ rebuild

    def request_rebuild(self, name: str) -> Generation:
        """Start building generation N+1 of NAME (``_rebuild_request``); the run loop
        switches to it when it has caught up. (A part of a view is rebuilt in place with
        ``rebuild_part``.)"""
        generation = request_rebuild(self.catalog, self.config.store_dsn, self.registry, name)
        if name not in self.registry.views:
            self._health.pop(name, None)  # a failed live generation no longer stops NAME
        return generation

    def rebuild_part(self, name: str, *, stream: str | None = None,
                     key_from: str | None = None, key_to: str | None = None) -> PartReport:
        """Recompute one stream's part or one key range of NAME's live view in place (see
        ``_targeted``); the projection's queries in this runner are stopped first."""
        if name in self.registry.views:
            raise ProjectionStateError(
                f"{name} is a view: it is rebuilt whole (`lakefold rebuild {name}` without "
                "--stream, --key-from or --key-to)")
        projection = self.registry.get(name)
        self.prepare()
        self._stop_projection(name)
        return rebuild_part(self.spark, self.catalog, projection, dsn=self.config.store_dsn,
                            redis_url=self.config.redis_url, stream=stream,
                            key_from=key_from, key_to=key_to)

    # ------------------------------------------------------------------ the loop

    def heads(self, projection: Projection) -> dict[str, int]:
        return {s.alias: source_reads.head(self.config.store_dsn, s) for s in projection.sources}

    def run(self, *, until_caught_up: bool = False, stop: threading.Event | None = None,
            timeout: float | None = None) -> list[ProjectionReport]:
        """Run until ``stop`` is set (or, with ``until_caught_up``, until every projection has
        processed everything that was in the stores when the call started, and every
        requested rebuild has switched). Returns what each projection did; at the end, the
        projections this run ran are left ``stopped`` in the catalog (unless paused or
        failed), whether it ends cleanly or by an error."""
        self.prepare()
        self.tally = RunTally()
        stop = stop or threading.Event()
        deadline = None if timeout is None else time.monotonic() + timeout
        targets = {p.name: self.heads(p) for p in self.projections} if until_caught_up else {}
        view_heads = self.views.heads() if self.views is not None and until_caught_up else {}
        views_caught_up: float | None = None
        outages = 0  # looks in a row that could not reach the store
        try:
            while not stop.is_set():
                try:
                    done = [self._tick(p, targets.get(p.name)) for p in self.projections]
                    views_quiet = self.views is None or self.views.tick()
                except TransientError as e:  # the store went away: wait for it, then go on
                    outages += 1
                    delay = retry_delay(outages)
                    log.warning("cannot reach the store (%s); trying again in %.0f s",
                                str(e).splitlines()[0], delay)
                    if deadline is not None and time.monotonic() + delay > deadline:
                        raise
                    stop.wait(delay)
                    continue
                if outages:
                    log.warning("the store is back; running again")
                    outages = 0
                if until_caught_up:
                    for projection, caught_up in zip(self.projections, done, strict=True):
                        if caught_up:
                            self.tally.caught_up(projection.name)
                    if all(done) and views_quiet and (self.views is None or (
                            self.views.caught_up(view_heads)
                            and not self.views.rebuilding())):
                        views_caught_up = time.monotonic()
                        break
                if deadline is not None and time.monotonic() > deadline:
                    raise ProjectionTimeoutError(f"projections not caught up within {timeout} s")
                if views_quiet:  # else the views go on at once: they may have more to do
                    stop.wait(self.config.poll_seconds)
        finally:
            self.stop_all()
            if self.views is not None:
                self.views.close()
            try:
                self._record_stopped()
            except LakefoldError as e:  # the store went away; status tells by the locks
                log.warning("could not record the projections as stopped: %s", e)
        views = [] if self.views is None else \
            self.views.report(self.tally.started, views_caught_up)
        views += [ProjectionReport(name, self.catalog.current(name).generation, "failed",
                                   False, 0, 0, {}, 0.0, self.catalog.projection(name).last_error)
                  for name in sorted(self.drifted)]
        return self.tally.report(self.catalog, self.projections) + views

    def _record_stopped(self) -> None:
        """Leave the projections this run ran (not those another process runs) ``stopped``
        in the catalog rather than ``running``: nothing runs them any more."""
        for projection in self.projections:
            health = self._health.get(projection.name)
            ran = projection.name in self.tally.sinks
            if not ran and (health is None or health.remote):
                continue
            if self.catalog.projection(projection.name).state in RUNNING_STATES:
                self.catalog.set_state(projection.name, "stopped", keep_error=True)

    def stop_all(self) -> None:
        """Stop every query and release every generation lock this runner holds."""
        try:
            for query in list(self.queries.values()):
                query.stop()
            self.queries.clear()
        finally:
            self._release_held()

    def _release_held(self, name: str | None = None, *, keep: Iterable[int] = ()) -> None:
        """Release the locks held for retries: of ``name`` (default: every projection's),
        except those of its generations in ``keep``."""
        kept = set(keep)
        for key in [k for k in self._held if name in (None, k[0]) and k[1] not in kept]:
            self._unhold(key)

    def close(self) -> None:
        """Stop every query and close the catalog's connection (the sinks share it)."""
        self.stop_all()
        self.catalog.close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stop_projection(self, name: str) -> None:
        self._switching.pop(name, None)
        for key in [k for k in self.queries if k[0] == name]:
            self.queries.pop(key).stop()
        self._release_held(name)

    def _tick(self, projection: Projection, target: dict[str, int] | None) -> bool:
        """One look at one projection; True when it is caught up with ``target`` (or paused,
        or failed: nothing more will happen to it in this run)."""
        name = projection.name
        health = self._health.setdefault(name, _Health())
        row = self.catalog.projection(name)
        if row.paused:
            if any(k[0] == name for k in (*self.queries, *self._held)):
                self._stop_projection(name)
            if row.state != "paused":
                self.catalog.set_state(name, "paused", keep_error=True)
            return True
        if health.given_up:
            if row.state == "failed":
                return True
            self._health[name] = health = _Health()  # resumed by `lakefold resume`
        live = self.catalog.current(name)
        building = self.catalog.building(name)
        if building is None:
            health.behind.clear()
        # a generation switched away from (or abandoned) while it waited for a retry
        self._release_held(name, keep=(live.generation,
                                       *((building.generation,) if building else ())))
        if name not in self._switching and not self._ensure(projection, live, "live", health) \
                and live.generation not in health.behind:
            return health.given_up
        if building is not None:
            if not self._ensure(projection, building, "rebuild", health):
                return health.given_up
            self._maybe_switch(projection, live, building)
        expected = "rebuilding" if self.catalog.building(name) is not None else "running"
        if row.state != expected:
            self.catalog.set_state(name, expected, keep_error=True)
        if target is None:
            return False
        if self.catalog.building(name) is not None:
            return False
        query = self.queries.get((name, self.catalog.current(name).generation))
        if query is None:
            return False
        end = query.end()
        return all(end.get(alias, 0) >= head + 1 for alias, head in target.items())

    def _ensure(self, projection: Projection, generation: Generation, role: str,
                health: _Health) -> bool:
        """Keep the generation's query running; False while it is down."""
        key = (projection.name, generation.generation)
        query = self.queries.get(key)
        if query is not None and query.active:
            if health.failures and query.sink is not None \
                    and query.sink.progress.batch_id is not None:
                health.failures = 0  # a batch got through: the failure is over
            return True
        if query is not None:
            error = query.failure()
            if error is not None:  # held while the retry waits (``_query_failed`` decides)
                self._hold(key, query.take_lock())
            query.stop()
            del self.queries[key]
            if error is not None:
                self._query_failed(projection, generation, role, health, error)
            return False
        if generation.generation in health.behind:
            return False
        if health.given_up or time.monotonic() < health.retry_at:
            return False
        query = GenerationQuery(self, projection, generation, role=role,
                                lock=self._held.pop(key, None))
        try:
            started = query.start()
        except Exception as e:
            self._hold(key, query.take_lock())
            self._query_failed(projection, generation, role, health, e)
            return False
        if not started:
            health.remote.add(generation.generation)
            return False
        self.queries[key] = query
        return True

    def _hold(self, key: tuple[str, int], lock: psycopg.Connection[Any] | None) -> None:
        """Keep a failed query's generation lock while its retry waits."""
        if lock is not None:
            self._held[key] = lock

    def _unhold(self, key: tuple[str, int]) -> None:
        """Release a generation lock held for a retry that will not come."""
        lock = self._held.pop(key, None)
        if lock is not None:
            lock.close()

    def _query_failed(self, projection: Projection, generation: Generation, role: str,
                      health: _Health, error: BaseException) -> None:
        """A live generation behind compaction while its rebuild runs just waits for the
        switch (the rebuild is the fix); anything else goes to ``_failed``. The generation's
        lock stays held only while a retry waits."""
        key = (projection.name, generation.generation)
        if role == "live" and isinstance(error, BehindCompactionError) \
                and self.catalog.building(projection.name) is not None:
            self._unhold(key)
            health.behind.add(generation.generation)
            log.warning("projection %s: generation %d stays stopped until its rebuild switches: "
                        "%s", projection.name, generation.generation, error)
            return
        self._failed(projection, health, error)
        if health.given_up:
            self._unhold(key)

    def _failed(self, projection: Projection, health: _Health, error: BaseException) -> None:
        """A query stopped with ``error``. Terminal errors (a record that failed under the
        ``stop`` policy, a definition or target error) fail the projection at once; anything
        else (a lost connection, a commit conflict, a Spark worker that did not start) is
        retried with exponential backoff (``_backoff``: 1 s doubling up to a minute), for as
        long as it takes; the count restarts whenever a batch gets through."""
        health.failures += 1
        text = _describe(error)
        health.last_error = text
        if _terminal(error):
            health.given_up = True
            self.catalog.set_state(projection.name, "failed", error=text)
            log.error("projection %s failed: %s", projection.name, text)
            return
        delay = retry_delay(health.failures)
        health.retry_at = time.monotonic() + delay
        self.catalog.set_state(projection.name, "retrying", error=text)
        log.warning("projection %s failed (attempt %d), retrying in %.1f s: %s",
                    projection.name, health.failures, delay, text)

    def _maybe_switch(self, projection: Projection, live: Generation,
                      building: Generation) -> None:
        """Switch NAME to ``building`` once it holds at least what ``live`` holds.

        When the new generation has reached the live one's position, the live query is
        stopped (its last position is then final) and the switch waits until the new
        generation has reached that final position too: a reader never sees the view go
        back in time across the switch.
        """
        name = projection.name
        new = self.queries.get((name, building.generation))
        if new is None or new.sink is None or new.sink.progress.batch_id is None:
            return
        old = self.queries.get((name, live.generation))
        frozen = self._switching.get(name)
        live_end = frozen if frozen is not None else (
            old.end() if old is not None else dict(live.position))
        new_end = new.end()
        aliases = [s.alias for s in projection.sources]
        if not all(new_end.get(a, 0) >= max(live_end.get(a, 0), 1) for a in aliases):
            return
        if frozen is None and old is not None:
            old.stop()  # its last batch is committed when stop returns
            self.queries.pop((name, live.generation), None)
            self._switching[name] = old.end(pending=True)
            return  # compare with the final position at the next look
        dropped = self.catalog.switch(name, building.generation)
        self._switching.pop(name, None)
        new.role = "live"
        new.sink.publish()
        self.drop_generations(dropped)
        log.info("projection %s switched to generation %d", name, building.generation)
        try:  # the retired generation no longer holds the compaction of its streams
            release_gone(self.config.store_dsn, self.catalog)
        except (LakefoldError, psycopg.Error) as e:
            log.warning("projection %s: the changelog positions of its retired generation "
                        "were not released (%s); the next `lakefold run` releases them",
                        name, e)

    def drop_generations(self, generations: Iterable[Generation]) -> None:
        """Delete the sinks of retired generations and mark them dropped."""
        for generation in generations:
            if (generation.name, generation.generation) in self.queries:
                raise ProjectionStateError(
                    f"generation {generation.generation} of {generation.name} is running"
                )
            drop_generation_storage(generation.locations, TargetContext(
                generation.name, generation.generation, redis_url=self.config.redis_url,
                redis_namespace=self.config.roots.redis_namespace))
            remove_checkpoint(generation.checkpoint_dir)
            FoldKeys(self.config.store_dsn).drop(generation.name, generation.generation)
            self.catalog.mark_dropped(generation.name, generation.generation)



def _terminal(error: BaseException) -> bool:
    """True for errors that retrying cannot fix: a lakefold terminal error, also when it
    reaches us wrapped in a Spark error (read from the marker every lakefold error carries
    into its traceback text)."""
    if isinstance(error, LakefoldError):
        return not error.transient
    marker = marker_in(str(error))
    return marker is not None and not marker.transient


_PY_ERROR = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Z]\w*(?:Error|Exception|Failed|Unavailable))"
                       r": (.+)$")


def _describe(error: BaseException) -> str:
    """One line: the innermost Python error of a Spark failure, else the error's first line."""
    text = str(error).strip() or type(error).__name__
    lines = text.split("JVM stacktrace:")[0].splitlines()
    for line in reversed(lines):
        match = _PY_ERROR.match(line.strip())
        if match:
            return f"{match[1]}: {match[2]}"[:2000]
    return f"{type(error).__name__}: {lines[0] if lines else text}"[:2000]
