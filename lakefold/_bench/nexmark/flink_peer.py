"""The Flink SQL peer: PyFlink (``apache-flink`` from PyPI) in a local mini-cluster with
parallelism 2, reading the events' Parquet files with Flink's filesystem source and Parquet
format, running ``flink_job.py`` in the Flink virtualenv (``make peers`` creates it and fetches
the Parquet format's jars through Maven; see the Makefile).

``events_per_s``: the events / seconds from a query's submission into a ``blackhole`` sink to
the job's end (the source is bounded). The result: the same query again, its changelog
collected and applied (only up to ``collect_limit`` events: collecting goes through Python).
``state_bytes``: the largest checkpoint's state size seen in that second run (``flink_job.py``:
a floor, not the peak, since a run of seconds completes one early checkpoint or none; null
when none was seen or the results are not collected).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa

from lakefold._bench.nexmark.queries import LATENESS_S, Query
from lakefold._bench.nexmark.spark_peer import PeerRun
from lakefold._bench.report import BenchmarkError
from lakefold.core.fetched_jars import PEERS_DIR, fetched_jars

#: Where ``make peers`` puts the jars (a cache the project controls).
JARS = PEERS_DIR / "flink"
JOB = Path(__file__).with_name("flink_job.py")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def default_python() -> Path:
    """The Flink virtualenv's interpreter: ``.venv-flink`` beside this environment's
    ``.venv`` (where ``make peers`` creates it)."""
    return Path(sys.prefix).parent / ".venv-flink" / "bin" / "python"


def run_queries(queries: list[Query], *, folder: Path, scratch: Path, events: int,
                python: Path, collect: bool, log: Path,
                timeout_s: float = 600) -> dict[str, PeerRun]:
    """Run ``queries`` in one PyFlink process (see the module docstring); a job still running
    after ``timeout_s`` is cancelled and reported as not run."""
    jars, missing = fetched_jars(JARS, ["flink-sql-parquet-"])
    if not python.exists() or missing:
        raise BenchmarkError(
            f"the Flink peer needs PyFlink in {python.parent.parent} and Flink's Parquet jars "
            f"in {JARS}; run `make peers` (or pass --peers spark to leave Flink out)")
    out = scratch / "flink-out"
    spec = {"events": str(folder), "jars": [str(j) for j in jars], "parallelism": 2,
            "out": str(out), "lateness_s": LATENESS_S, "timeout_s": timeout_s,
            "rest_port": _free_port(),
            "queries": [{"name": q.name, "sql": q.flink, "collect": collect}
                        for q in queries if q.flink is not None]}
    spec_path = scratch / "flink-spec.json"
    spec_path.write_text(json.dumps(spec))
    with log.open("ab") as sink:
        done = subprocess.run([str(python), str(JOB), str(spec_path)],  # noqa: S603 - our argv
                              stdout=subprocess.PIPE, stderr=sink, check=False,
                              cwd=scratch)
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    if done.returncode != 0 or not lines:
        raise BenchmarkError(f"the Flink peer failed (exit {done.returncode}); see {log}")
    report: dict[str, Any] = json.loads(lines[-1])
    runs: dict[str, PeerRun] = {}
    for query in queries:
        if query.flink is None:
            runs[query.name] = PeerRun(error=query.flink_note or "not run on Flink")
            continue
        got = report.get(query.name, {"error": "no report"})
        if "error" in got:
            runs[query.name] = PeerRun(error=got["error"])
            continue
        run = PeerRun(events_per_s=round(events / got["seconds"]), seconds=got["seconds"],
                      result_error=got.get("result_error"),
                      state_bytes=got.get("state_bytes"))
        result = out / f"{query.name}.json"
        if result.exists():
            data = json.loads(result.read_text())
            run.result = pa.Table.from_pylist(data["rows"]) if data["rows"] else \
                pa.table({c: pa.array([], pa.null()) for c in data["columns"]})
        runs[query.name] = run
    return runs
