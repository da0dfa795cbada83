"""The projection benchmarks run at a tiny size and print the agreed JSON shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)


def bench(*args: str) -> dict[str, object]:
    lakefold = str(Path(sys.executable).with_name("lakefold"))
    out = subprocess.run([lakefold, "bench", *args, "--json"],
                         capture_output=True, text=True, timeout=280, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    report: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return report


def test_latency_bench_shape():
    report = bench("latency", "--seconds", "3", "--warmup", "1", "--rows", "200",
                   "--rate", "200")
    results = report["results"]
    assert isinstance(results, dict)
    for target in ("delta", "redis", "search"):
        for q in ("p50", "p99"):
            assert results[f"{target}_{q}_ms"] > 0
    assert report["baseline"]["changelog_p50_ms"] > 0  # type: ignore[index]


def test_rebuild_bench_shape():
    report = bench("rebuild", "--events", "3000", "--customers", "10", "--batch", "1000")
    assert report["results"]["rebuild_events_per_s"] > 0  # type: ignore[index]
    assert report["baseline"]["batch_aggregate_events_per_s"] > 0  # type: ignore[index]


def test_views_bench_shape():
    report = bench("views", "--orders", "2000", "--customers", "200", "--products", "100",
                   "--seconds", "4", "--warmup", "1", "--rate", "100", "--probes", "2")
    results = report["results"]
    assert isinstance(results, dict)
    for metric in ("rebuild_rows_per_s", "batch_s", "batch_cost_ratio", "empty_batch_s",
                   "view_p50_ms", "view_p99_ms"):
        assert results[metric] > 0, metric
    assert report["baseline"]["full_recompute_s"] > 0  # type: ignore[index]
    assert report["params"]["probes_missed"] == 0  # type: ignore[index]
