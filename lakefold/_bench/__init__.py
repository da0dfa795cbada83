"""``lakefold bench NAME``: benchmarks that start their own services and print one JSON object.

Each benchmark module adds one command to ``bench_app`` when ``register_benchmarks`` imports
it; the report shape is fixed by ``report.Report``.
"""

from __future__ import annotations

import importlib

import typer

bench_app = typer.Typer(
    no_args_is_help=True,
    help="Benchmarks. Each starts throwaway services and prints results with a same-run baseline.",
)

#: The benchmark modules; each adds its command to ``bench_app`` when imported.
BENCHMARKS = ("aggregates", "append", "capture", "console", "delta_spark", "latency", "nexmark",
              "rebuild", "replay", "snapshot", "views", "windows")


def register_benchmarks() -> None:
    """Import every benchmark module (registering its command). The CLI does this only for
    ``lakefold bench ...``: the modules import pyarrow, psycopg and the stores, which would
    otherwise slow every ``lakefold`` command's start."""
    for name in BENCHMARKS:
        importlib.import_module(f"lakefold._bench.{name}")


__all__ = ["BENCHMARKS", "bench_app", "register_benchmarks"]
