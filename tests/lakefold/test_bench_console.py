"""``lakefold bench console`` runs at a tiny size and prints the agreed JSON shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)


def test_console_bench_shape() -> None:
    lakefold = str(Path(sys.executable).with_name("lakefold"))
    out = subprocess.run([lakefold, "bench", "console", "--events", "20000", "--customers", "10",
                          "--batch", "5000", "--clients", "5", "--interval", "0.2",
                          "--seconds", "3", "--rounds", "1", "--json"],
                         capture_output=True, text=True, timeout=280, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["benchmark"] == "console" and report["params"]["clients"] == 5
    results = report["results"]
    for metric in ("overview_p50_ms", "overview_p99_ms", "overview_max_ms",
                   "projection_events_per_s"):
        assert results[metric] > 0, metric
    assert results["requests"] >= 5 * 3 and results["errors"] == 0
    assert isinstance(results["throughput_effect_pct"], float)
    assert report["baseline"]["projection_events_per_s"] > 0
