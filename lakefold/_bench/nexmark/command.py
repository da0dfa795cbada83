"""``lakefold bench nexmark``: the run, from the events to the report (see the package
docstring for what is measured)."""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from lakefold._bench import bench_app
from lakefold._bench.nexmark.generator import Config, generate
from lakefold._bench.nexmark.queries import BY_NAME, LATENESS_S, NOT_RUN, QUERIES, Query
from lakefold._bench.report import BenchmarkError, Report

PEERS = ("spark", "flink")
TARGET = ("results.correct[q] for every query lakefold runs; events_per_s >= 1.0 x Spark where "
          "Spark runs the query, >= 0.5 x Flink on every query (>= 1.0 x on q3, q4, q5, q7, "
          "q8, q11)")


@dataclass(frozen=True)
class Shape:
    """What one run does."""

    config: Config
    queries: tuple[Query, ...]
    peers: tuple[str, ...]
    file_events: int
    collect_limit: int
    flink_python: Path
    flink_log: Path
    flink_timeout_s: float


def _compare(result: Any | None, query: Query, want: Any, *, columns: tuple[str, ...] = (),
             closed_before: int | None = None) -> dict[str, Any]:
    """``correct`` and the differences of ``result`` from the oracle's rows ``want``;
    ``closed_before``: compare only rows whose ``spark_closed_by`` column is at or before it
    (Spark's append mode leaves out what its watermark did not close), counting the others as
    ``open_not_emitted``."""
    from collections import Counter

    from lakefold._bench.nexmark.oracle import differences, normalise

    got = Counter() if result is None else normalise(result, columns or query.columns)
    out: dict[str, Any] = {}
    if closed_before is not None and query.spark_closed_by is not None:
        at = query.columns.index(query.spark_closed_by)
        closed = Counter({r: n for r, n in want.items() if r[at] <= closed_before})
        out["open_not_emitted"] = sum(want.values()) - sum(closed.values())
        want = closed
    found = differences(got, want)
    out["correct"] = found["missing"] == 0 and found["extra"] == 0
    out["rows"] = found["rows"]
    if not out["correct"]:
        out["differences"] = found
    return out


def _lakefold(spark: Any, dsn: str, scratch: Path, query: Query, events: int,
              want: Any) -> dict[str, Any]:
    from lakefold._bench.nexmark.lakefold_engine import run_views

    entry: dict[str, Any] = {"what": query.what}
    if query.lakefold_note:
        entry["note"] = query.lakefold_note
    runs = []
    if query.lakefold_native:
        native = run_views(spark, dsn, scratch, query.lakefold_native, events)
        if native.error is None:
            entry["form"] = "native"
            runs.append(native)
        else:
            entry["refused"] = native.error
    if not runs and query.lakefold:
        entry["form"] = "chain" if len(query.lakefold) > 1 else \
            "rewrite" if query.lakefold_native else "view"
        runs.append(run_views(spark, dsn, scratch, query.lakefold, events))
    if not runs:
        entry.update(form="refused", correct=None, events_per_s=None)
        return entry
    run = runs[0]
    if run.error is not None:
        entry.update(error=run.error, correct=False, events_per_s=None)
        return entry
    entry.update(events_per_s=run.events_per_s, seconds=run.seconds,
                 output_events_per_s=run.output_events_per_s,
                 delta_seconds=run.target_seconds, state_bytes=run.state_bytes,
                 batches=run.batches)
    views = query.lakefold_native if entry["form"] == "native" else query.lakefold
    entry.update(_compare(run.result, query, want, columns=views[-1].columns))
    return entry


def _peer_entry(run: Any, query: Query, want: Any | None) -> dict[str, Any]:
    if run.error is not None:
        return {"events_per_s": None, "not_run": run.error}
    entry: dict[str, Any] = {"events_per_s": run.events_per_s, "seconds": run.seconds,
                             "state_bytes": run.state_bytes}
    if run.result_error is not None:
        entry.update(correct=None, not_checked=run.result_error)
    elif run.result is not None and want is not None:
        entry.update(_compare(run.result, query, want, closed_before=run.watermark_ms))
    else:
        entry["correct"] = None  # not collected at this size
    return entry


def _ratios(entry: dict[str, Any], spark: dict[str, Any] | None,
            flink: dict[str, Any] | None) -> None:
    mine = entry.get("events_per_s")
    for name, peer in (("spark", spark), ("flink", flink)):
        theirs = None if peer is None else peer.get("events_per_s")
        if mine and theirs:
            entry[f"ratio_to_{name}"] = round(mine / theirs, 3)


def run(shape: Shape) -> Report:
    """Generate, load, run every engine, check every result; see the package docstring."""
    from lakefold._bench.nexmark.flink_peer import run_queries as run_flink
    from lakefold._bench.nexmark.loading import append_events, write_parquet
    from lakefold._bench.nexmark.oracle import Oracle
    from lakefold._bench.nexmark.spark_peer import run_query as run_spark, session
    from lakefold.local import LocalPostgres

    config = shape.config
    report = Report("nexmark", {
        "events": config.events, "seed": config.seed, "rate": config.rate,
        "disorder": config.disorder, "disorder_bound_ms": config.disorder_bound_ms,
        "lateness_s": LATENESS_S, "queries": [q.name for q in shape.queries],
        "peers": list(shape.peers), "file_events": shape.file_events, "target": TARGET,
        "not_run": NOT_RUN})
    scratch = Path(tempfile.mkdtemp(prefix="lakefold-bench-nexmark-"))
    try:
        began = time.perf_counter()
        events = generate(config)
        report.params["generate_s"] = round(time.perf_counter() - began, 2)
        folder = scratch / "events"
        write_parquet(events, folder, shape.file_events)
        oracle = Oracle(folder)
        report.params["largest_disorder_ms"] = oracle.check_no_late(config)
        wants = {q.name: oracle.rows(q) for q in shape.queries}
        queries: dict[str, Any] = {}
        spark_runs: dict[str, Any] = {}
        with LocalPostgres(durable=True) as server:
            server.start()
            dsn = server.dsn()
            report.params["load_events_per_s"] = round(append_events(dsn, events))
            del events
            spark = session("lakefold-bench-nexmark")
            for query in shape.queries:
                queries[query.name] = _lakefold(spark, dsn, scratch / "lake", query,
                                                config.events, wants[query.name])
                if "spark" in shape.peers:
                    run_ = run_spark(spark, folder, scratch, query, config.events)
                    spark_runs[query.name] = _peer_entry(run_, query, wants[query.name])
            spark.stop()  # its JVM's memory goes to Flink's
        flink_runs: dict[str, Any] = {}
        if "flink" in shape.peers:
            collect = config.events <= shape.collect_limit
            for name, run_ in run_flink(
                    list(shape.queries), folder=folder, scratch=scratch, events=config.events,
                    python=shape.flink_python, collect=collect, log=shape.flink_log,
                    timeout_s=shape.flink_timeout_s).items():
                flink_runs[name] = _peer_entry(run_, BY_NAME[name],
                                               wants[name] if collect else None)
        oracle.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for name, entry in queries.items():
        _ratios(entry, spark_runs.get(name), flink_runs.get(name))
    report.results["queries"] = queries
    report.results["correct"] = {n: e.get("correct") for n, e in queries.items()}
    if spark_runs:
        report.baseline["spark"] = spark_runs
    if flink_runs:
        report.baseline["flink"] = flink_runs
    return report


def _queries(text: str | None) -> tuple[Query, ...]:
    if not text:
        return QUERIES
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        skipped = [n for n in unknown if n in NOT_RUN]
        why = f" ({skipped[0]}: {NOT_RUN[skipped[0]]})" if skipped else ""
        raise BenchmarkError(f"unknown or not run query {unknown[0]!r}{why}; the queries are "
                             f"{', '.join(BY_NAME)}")
    return tuple(BY_NAME[n] for n in names)


@bench_app.command("nexmark")
def nexmark(
    events: Annotated[int, typer.Option(help="Nexmark events (persons:auctions:bids = "
                                             "1:3:46).")] = 1_000_000,
    queries: Annotated[str | None, typer.Option(
        help="Comma-separated queries (default: all that run), e.g. q3,q5.")] = None,
    peers: Annotated[str, typer.Option(help="Peers measured beside: spark, flink, both "
                                            "(comma-separated) or none.")] = "spark,flink",
    seed: Annotated[int, typer.Option(help="The generator's seed.")] = 42,
    rate: Annotated[int, typer.Option(help="Nominal events per second of event time.")]
    = 10_000,
    disorder: Annotated[int, typer.Option(help="Out-of-order group size (events).")] = 10_000,
    file_events: Annotated[int, typer.Option(help="Events per Parquet file (one Spark "
                                                  "micro-batch each).")] = 20_000,
    collect_limit: Annotated[int, typer.Option(help="Largest --events at which Flink's "
                                                    "results are collected and checked.")]
    = 1_000_000,
    flink_python: Annotated[Path | None, typer.Option(
        help="PyFlink's interpreter (default: .venv-flink beside the .venv, from "
             "`make peers`).")] = None,
    flink_timeout: Annotated[float, typer.Option(
        help="Seconds a Flink job may run before it is cancelled (reported as not run).")]
    = 600,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Nexmark: lakefold's views against Spark Structured Streaming and Flink SQL on the same
    events, each checked against a DuckDB batch oracle."""
    from lakefold._bench.nexmark.flink_peer import default_python

    chosen = tuple(p.strip().lower() for p in peers.split(",") if p.strip() and
                   p.strip().lower() != "none")
    bad = [p for p in chosen if p not in PEERS]
    if bad or events < 1_000 or rate < 1 or disorder < 1 or file_events < 1:
        raise BenchmarkError("need --events >= 1000, --rate, --disorder and --file-events >= "
                             f"1, and --peers among {', '.join(PEERS)} or none")
    config = Config(events, seed=seed, rate=rate, disorder=disorder)
    if config.disorder_bound_ms >= LATENESS_S * 1000:
        raise BenchmarkError(f"--disorder {disorder} at --rate {rate} puts events up to "
                             f"{config.disorder_bound_ms} ms out of order, not below the "
                             f"lateness of {LATENESS_S} s; lower --disorder")
    import os

    # beside Spark's driver log (the scratch folder goes at the end of the run)
    log = Path(tempfile.gettempdir()) / f"lakefold-{os.getuid()}" / "flink-peer.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    shape = Shape(config, _queries(queries), chosen, file_events, collect_limit,
                  flink_python or default_python(), log, flink_timeout)
    run(shape).emit(as_json=as_json)
