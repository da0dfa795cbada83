"""The one JSON shape every benchmark prints, and the machine description that goes with it."""

from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

from lakefold.core.exceptions import TerminalError


class BenchmarkError(TerminalError):
    """A benchmark cannot run as asked, or its result failed its own check (and is invalid)."""


_VERSIONED = ["lakefold", "pyspark", "deltalake", "psycopg", "pyarrow", "redis", "tantivy",
              "eventsourcing"]


def machine() -> dict[str, Any]:
    """Cores, memory and the versions that matter for the figures."""
    versions = {"python": platform.python_version()}
    for name in _VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "cpu": platform.processor() or platform.machine(),
        "versions": versions,
    }


@dataclass
class Report:
    """``{"benchmark", "params", "results", "baseline", "peers", "machine"}``: results, baseline
    and peers map metric names to numbers (or, for a bench of several queries, to objects of
    them, e.g. ``results.queries.q5.events_per_s``); the baseline is measured in the same
    run."""

    benchmark: str
    params: dict[str, Any]
    results: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] = field(default_factory=dict)
    peers: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark,
            "params": self.params,
            "results": self.results,
            "baseline": self.baseline,
            "peers": self.peers,
            "machine": machine(),
        }

    def emit(self, *, as_json: bool) -> None:
        """Print as one JSON object on stdout, or as a table for people."""
        if as_json:
            sys.stdout.write(json.dumps(self.as_dict()) + "\n")
            sys.stdout.flush()
            return
        table = Table(title=f"lakefold bench {self.benchmark} {self.params}")
        table.add_column("group")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for group, values in (("results", self.results), ("baseline", self.baseline),
                              ("peers", self.peers)):
            for name, value in _flat(values):
                shown = f"{value:,.2f}" if isinstance(value, (int, float)) and \
                    not isinstance(value, bool) else str(value)
                table.add_row(group, name, shown)
        Console().print(table)


def _flat(values: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Nested metrics as (dotted name, value) pairs."""
    out: list[tuple[str, Any]] = []
    for name, value in values.items():
        if isinstance(value, dict):
            out += _flat(value, f"{prefix}{name}.")
        else:
            out.append((f"{prefix}{name}", value))
    return out
