"""Projection commands: ``lakefold run``, ``rebuild``, ``pause``, ``resume``, ``status``,
``dlq list|retry|drop`` and ``search``.

``run`` and ``rebuild`` need the projections module (``--projections FILE`` or the
``projections`` setting); the others read the catalog only, from any machine that reaches the
store.
"""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lakefold.cli._common import app, print_table
from lakefold.core.exceptions import ConfigurationError
from lakefold.projections.exceptions import ProjectionTerminalError

if TYPE_CHECKING:
    from lakefold.projections import ProjectionReport, Registry
    from lakefold.projections.operations import Catalog
    from lakefold.settings import Settings

dlq_app = typer.Typer(no_args_is_help=True,
                      help="Dead letters: records that failed every retry.")
app.add_typer(dlq_app, name="dlq")
_out = Console()

ProjectionsOption = Annotated[
    str | None,
    typer.Option("--projections", "-p", help="Python file (or module) that defines the "
                 "projections (default: the `projections` setting).", show_default=False),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def _settings() -> Settings:
    from lakefold.settings import load_settings

    return load_settings()


def _store_dsn(settings: Settings) -> str:
    dsn = settings.resolved_store_dsn()
    if not dsn:
        raise ConfigurationError(
            "no store DSN: set LAKEFOLD_STORE_DSN (or LAKEFOLD_DSN) to the PostgreSQL database "
            "that holds lakefold's schema"
        )
    return dsn


def _catalog(settings: Settings, *, install: bool = True) -> Catalog:
    """The projection catalog; ``install`` creates its tables when missing (a command that
    only reads passes False and checks ``_catalog_installed`` first: a read never writes)."""
    from lakefold.projections.operations import Catalog, SinkRoots

    catalog = Catalog(_store_dsn(settings), SinkRoots.under(settings.home, settings.lake_location))
    if install:
        catalog.install()
    return catalog


def _catalog_installed(settings: Settings) -> bool:
    """Whether the store holds the projection catalog (and so may hold projections)."""
    import psycopg

    from lakefold.core.dsn import connection_problem, mask_dsn
    from lakefold.projections.exceptions import CatalogUnavailableError

    dsn = _store_dsn(settings)
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute("SELECT to_regclass('lakefold.projections') IS NOT NULL"
                               ).fetchone()
    except psycopg.OperationalError as e:
        raise CatalogUnavailableError(
            f"cannot connect to the store at {mask_dsn(dsn)}: {connection_problem(e, dsn)}"
        ) from e
    return bool(row and row[0])


def _registry(settings: Settings, location: str | None,
              names: tuple[str, ...] = ()) -> Registry:
    """The projections module's registry; every one of ``names`` must be a projection or a
    view of it (ProjectionNotFoundError listing them all), checked before Spark starts."""
    from lakefold._from_settings import load_projections_module
    from lakefold.projections.exceptions import ProjectionNotFoundError

    where = location or settings.projections
    if not where:
        raise ConfigurationError(
            "no projections module: pass --projections FILE or set LAKEFOLD_PROJECTIONS"
        )
    registry = load_projections_module(where)
    known = sorted({p.name for p in registry} | set(registry.views))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ProjectionNotFoundError(
            f"no projection or view named {unknown[0]!r} in {where}; it defines "
            + (", ".join(known) or "none"))
    return registry


def _runner(settings: Settings, location: str | None, *, only: tuple[str, ...] = (),
            trigger: float | None = None) -> Any:
    from lakefold._from_settings import checked_lake, session_from_settings
    from lakefold.projections import Runner, RunnerConfig
    from lakefold.projections.operations import RUNNER_SPARK_CONF, SinkRoots

    registry = _registry(settings, location, only)
    _catalog_installed(settings)  # the store answers (or one line says why) before Spark starts
    redis_url = settings.redis_url.get_secret_value() if settings.redis_url else None
    config = RunnerConfig(store_dsn=_store_dsn(settings),
                          roots=SinkRoots.under(settings.home, checked_lake(settings)),
                          redis_url=redis_url, trigger_seconds=trigger, only=only)
    spark = session_from_settings(settings, conf=RUNNER_SPARK_CONF)
    return Runner(spark, registry, config)


@app.command("run")
def run(
    projections: ProjectionsOption = None,
    until_caught_up: Annotated[bool, typer.Option(
        "--until-caught-up", help="Stop once everything in the stores now is processed.")] = False,
    trigger: Annotated[float | None, typer.Option(
        help="Processing-time trigger in seconds for every projection (default: each "
             "projection's own).", show_default=False)] = None,
    only: Annotated[list[str] | None, typer.Option(
        "--only", help="Run only this projection (repeatable; a view with the views that read "
        "it).", show_default=False)] = None,
    as_json: JsonOption = False,
) -> None:
    """Run every registered projection: continuously, or up to the current head. At the end,
    print what each projection did (batches, records, position, time, state)."""
    settings = _settings()
    runner = _runner(settings, projections, only=tuple(only or ()), trigger=trigger)
    stop = threading.Event()
    try:
        runner.prepare()
        names = ", ".join(p.name for p in runner.projections)
        if not as_json:
            _out.print(f"running {escape(names)}" + (" until caught up" if until_caught_up
                                                     else "; Ctrl-C stops"))
        try:
            reports = runner.run(until_caught_up=until_caught_up, stop=stop)
        except KeyboardInterrupt:
            stop.set()
            _print_reports(runner.tally.report(runner.catalog, runner.projections), as_json)
            raise
        _print_reports(reports, as_json)
    finally:
        runner.close()
    failed = [r for r in reports if r.state == "failed"]
    if failed:
        raise ProjectionTerminalError(
            f"projection {failed[0].name} failed: {failed[0].error}; fix the cause, then run "
            f"`lakefold resume {failed[0].name}` and `lakefold run` again")


def _print_reports(reports: list[ProjectionReport], as_json: bool) -> None:
    """One row per projection: what this run did with it."""
    if as_json:
        typer.echo(json.dumps([r.as_json() for r in reports]))
        return
    table = Table(title="projections this run")
    for column in ("name", "gen", "batches", "records", "position", "time", "state"):
        table.add_column(column, justify="right" if column in ("batches", "records") else
                         "left")
    for r in reports:
        position = ", ".join(f"{alias}={at:,}" for alias, at in r.position.items())
        state = "caught up" if r.caught_up else r.state
        table.add_row(escape(r.name), str(r.generation), f"{r.batches:,}", f"{r.records:,}",
                      escape(position), f"{r.seconds:.1f} s", escape(state))
    print_table(_out, table)


@app.command("rebuild")
def rebuild(
    name: Annotated[str, typer.Argument(help="The projection to rebuild.")],
    projections: ProjectionsOption = None,
    stream: Annotated[str | None, typer.Option(
        help="Rebuild only what comes from this stream (event stream id or table).",
        show_default=False)] = None,
    key_from: Annotated[str | None, typer.Option(
        help="Rebuild only keys >= this value.", show_default=False)] = None,
    key_to: Annotated[str | None, typer.Option(
        help="Rebuild only keys < this value.", show_default=False)] = None,
    abandon: Annotated[bool, typer.Option(
        "--abandon", help="Give up the rebuild in progress (its sinks are dropped).")] = False,
    wait: Annotated[bool, typer.Option(
        help="Wait until the new generation is live.")] = True,
) -> None:
    """Replay NAME's whole history into a new generation and switch to it atomically."""
    settings = _settings()
    if abandon:
        with _catalog(settings) as catalog:
            building = catalog.building(name)
            if building is None:
                raise ConfigurationError(f"projection {name} is not being rebuilt")
            catalog.abandon(name, building.generation)
            from lakefold.projections.operations import release_gone

            release_gone(_store_dsn(settings), catalog)  # it no longer holds compaction
        _out.print(f"abandoned generation {building.generation} of {escape(name)}")
        return
    runner = _runner(settings, projections, only=(name,))
    try:
        runner.prepare()
        if stream or key_from is not None or key_to is not None:
            report = runner.rebuild_part(name, stream=stream, key_from=key_from, key_to=key_to)
            _out.print(f"rebuilt {report.rows:,} row(s) of {escape(name)} generation "
                       f"{report.generation} up to its position {report.position}")
            return
        from lakefold.projections.operations import projection_status

        generation = runner.request_rebuild(name)
        _out.print(f"building generation {generation.generation} of {escape(name)}")
        (status,) = projection_status(runner.catalog, runner.config.store_dsn, [name])
        if status.state not in ("running", "rebuilding", "retrying"):
            runner.run(until_caught_up=True)
        elif wait:
            while runner.catalog.current(name).generation < generation.generation:
                time.sleep(1)
        _out.print(f"{escape(name)} is now generation {runner.catalog.current(name).generation}")
    finally:
        runner.close()


def _set_paused(name: str, paused: bool) -> None:
    with _catalog(_settings()) as catalog:
        row = catalog.set_paused(name, paused)
        if not paused and row.state == "failed":
            catalog.set_state(name, "idle", keep_error=True)
    _out.print(f"{escape(name)} {'paused' if paused else 'resumed'}")


@app.command("pause")
def pause(name: Annotated[str, typer.Argument(help="The projection to pause.")]) -> None:
    """Pause a projection: its runner stops it within a second; progress is kept."""
    _set_paused(name, True)


@app.command("resume")
def resume(name: Annotated[str, typer.Argument(help="The projection to resume.")]) -> None:
    """Resume a paused (or failed) projection from its checkpoint."""
    _set_paused(name, False)


@app.command("status")
def status(as_json: JsonOption = False) -> None:
    """Per projection: generation, position, lag, throughput, state, last error; per view
    input: applied position, head and lag; every capture of the store (each source's slot,
    source, stream prefix, streams, records); per slot of the configured source: its
    health."""
    from lakefold.projections.operations import projection_status, slot_status
    from lakefold.store import ChangelogStore

    settings = _settings()
    statuses = []
    if _catalog_installed(settings):  # a fresh store has none, and a read writes nothing
        with _catalog(settings, install=False) as catalog:
            statuses = projection_status(catalog, _store_dsn(settings))
    with ChangelogStore(_store_dsn(settings)) as store:
        captures = store.captures()
    source_dsn = settings.source_dsn()
    slots = slot_status(source_dsn) if source_dsn else []
    if as_json:
        typer.echo(json.dumps({"projections": [s.as_json() for s in statuses],
                               "captures": [c.as_json() for c in captures],
                               "slots": [vars(s) for s in slots]}, default=str))
        return
    table = Table(title="projections")
    for column in ("name", "target", "gen", "state", "lag", "lag s", "rec/s", "dead", "late",
                   "error"):
        table.add_column(column)
    for s in statuses:
        gen = f"{s.generation}" + (f" → {s.rebuilding_generation}"
                                   if s.rebuilding_generation else "")
        table.add_row(s.name, s.target, gen, s.state, f"{s.lag_records:,}",
                      f"{s.lag_seconds:.1f}", f"{s.throughput_per_s:,.0f}", str(s.dead_letters),
                      f"{s.late_events:,}", escape((s.last_error or "")[:60]))
    print_table(_out, table)
    inputs = Table(title="view inputs")
    for column in ("view", "input", "applied", "head", "lag", "lag s"):
        inputs.add_column(column)
    for s in statuses:
        for source in s.sources if s.style == "view" else ():
            inputs.add_row(escape(s.name), escape(source.source), f"{source.position:,}",
                           f"{source.head:,}", f"{source.lag_records:,}",
                           f"{source.lag_seconds:.1f}")
    if inputs.row_count:
        print_table(_out, inputs)
    for s in statuses:
        if s.watermark is not None:
            _out.print(f"{escape(s.name)}: watermark {s.watermark}, {s.late_events:,} late "
                       "event window(s) not counted (lakefold late list)", soft_wrap=True)
    for s in statuses:  # a paused or stopped projection keeps its streams uncompacted
        for stream, position in s.holds_compaction.items():
            _out.print(f"{escape(s.name)} ({s.state}) holds the compaction of {escape(stream)} "
                       f"at position {position:,}", soft_wrap=True)
    if captures:  # every source's capture, read from the store
        capture_table = Table(title="captures")
        for column in ("slot", "source", "prefix", "streams", "records", "last commit"):
            capture_table.add_column(column)
        for c in captures:
            capture_table.add_row(escape(c.slot), escape(c.shown_source),
                                  escape("-" if c.stream_prefix is None else
                                         repr(c.stream_prefix)),
                                  escape(", ".join(c.streams) or "-"), f"{c.records:,}",
                                  str(c.last_commit_ts or "-"))
        print_table(_out, capture_table)
    if slots:
        slot_table = Table(title="capture slots")
        for column in ("slot", "active", "wal_status", "retained", "healthy"):
            slot_table.add_column(column)
        for slot in slots:
            slot_table.add_row(slot.slot, str(slot.active), str(slot.wal_status),
                               f"{slot.retained_bytes or 0:,} B", str(slot.healthy))
        print_table(_out, slot_table)


@dlq_app.command("list")
def dlq_list(
    name: Annotated[str | None, typer.Argument(help="Only this projection.")] = None,
    state: Annotated[str | None, typer.Option(
        "--status", help="open, retry, resolved or dropped.", show_default=False)] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 100,
    as_json: JsonOption = False,
) -> None:
    """List dead letters."""
    from lakefold.projections import DeadLetters

    settings = _settings()
    letters = []
    if _catalog_installed(settings):
        with _catalog(settings, install=False) as catalog:
            letters = DeadLetters(catalog).find(name, status=state, limit=limit)
    if as_json:
        typer.echo(json.dumps([d.as_json() for d in letters], default=str))
        return
    table = Table(title="dead letters")
    for column in ("id", "projection", "gen", "stage", "source", "position", "attempts",
                   "status", "error"):
        table.add_column(column)
    for d in letters:
        table.add_row(str(d.id), d.name, str(d.generation), d.stage, d.source, str(d.position),
                      str(d.attempts), d.status, escape(d.error[:80]))
    print_table(_out, table)


@dlq_app.command("retry")
def dlq_retry(ids: Annotated[list[int], typer.Argument(help="Dead-letter ids.")]) -> None:
    """Feed dead letters through their projection again (at its next batch)."""
    from lakefold.projections import DeadLetters

    with _catalog(_settings()) as catalog:
        done = DeadLetters(catalog).request_retry(ids)
    _out.print(f"queued {len(done)} dead letter(s) for retry")


@dlq_app.command("drop")
def dlq_drop(ids: Annotated[list[int], typer.Argument(help="Dead-letter ids.")]) -> None:
    """Give up on dead letters (they stay listed as dropped)."""
    from lakefold.projections import DeadLetters

    with _catalog(_settings()) as catalog:
        done = DeadLetters(catalog).drop(ids)
    _out.print(f"dropped {len(done)} dead letter(s)")


@app.command("search")
def search(
    view: Annotated[str, typer.Argument(help="A projection with a search_index target.")],
    query: Annotated[str, typer.Argument(help="Tantivy query, e.g. 'red kettle' or "
                                              "'name:mug'.")],
    limit: Annotated[int, typer.Option(help="At most this many hits.")] = 10,
    as_json: JsonOption = False,
) -> None:
    """Search a projection's current index."""
    from lakefold.projections import SearchIndexReader

    with _catalog(_settings()) as catalog:
        reader = SearchIndexReader(lambda name: catalog.current(name).location("search"))
        hits = reader.search(view, query, limit=limit)
    if as_json:
        typer.echo(json.dumps([{"key": h.key, "score": h.score, "document": h.document,
                                "matched": {f: m.as_json() for f, m in h.matched.items()}}
                               for h in hits], default=str))
        return
    table = Table(title=f"{view}: {query}")
    table.add_column("key")
    table.add_column("score", justify="right")
    table.add_column("matched (why it ranks here)")
    table.add_column("document")
    for hit in hits:
        fields = ", ".join(f"{k}={v}" for k, v in hit.document.items()
                           if not k.startswith("_"))
        matched = "; ".join(f"{f}: {m.marked()}" for f, m in hit.matched.items())
        table.add_row(hit.key, f"{hit.score:.2f}", escape(matched), escape(fields[:120]))
    print_table(_out, table)

