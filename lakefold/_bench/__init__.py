"""``lakefold bench NAME``: benchmarks that start their own services and print one JSON object.

Each benchmark module adds one command to ``bench_app``; the report shape is fixed by
``report.Report``.
"""

from __future__ import annotations

import typer

bench_app = typer.Typer(
    no_args_is_help=True,
    help="Benchmarks. Each starts throwaway services and prints results with a same-run baseline.",
)

__all__ = ["bench_app"]
from lakefold._bench import append as _append  # noqa: E402,F401
from lakefold._bench import capture as _capture  # noqa: E402,F401
from lakefold._bench import latency as _latency  # noqa: E402,F401
from lakefold._bench import rebuild as _rebuild  # noqa: E402,F401
from lakefold._bench import replay as _replay  # noqa: E402,F401
from lakefold._bench import snapshot as _snapshot  # noqa: E402,F401
