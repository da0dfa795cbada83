"""``lakefold bench append`` at a tiny size: the JSON has the issue's keys, all positive."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

KEYS = ["batched_events_per_s", "batched_incl_building_events_per_s",
        "single_1w_events_per_s", "single_1w_p99_ms",
        "single_16w_events_per_s", "single_16w_p99_ms", "read_events_per_s"]


@pytest.mark.timeout(240)
def test_bench_append_reports_every_key() -> None:
    lakefold = str(Path(sys.executable).parent / "lakefold")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}
    out = subprocess.run([lakefold, "bench", "append", "--json", "--events", "2000",
                          "--single-events", "128"],
                         capture_output=True, text=True, timeout=230, env=env)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["benchmark"] == "append"
    assert sorted(report["results"]) == sorted(KEYS)
    assert sorted(report["peers"]) == sorted(f"eventsourcing_{k}" for k in KEYS)
    assert list(report["baseline"]) == ["copy_rows_per_s"]
    values = [*report["results"].values(), *report["peers"].values(),
              *report["baseline"].values()]
    assert all(isinstance(v, float) and v > 0 for v in values), report
    assert report["params"]["events"] == 2000
    assert report["machine"]["versions"]["eventsourcing"] == "9.5.6"
