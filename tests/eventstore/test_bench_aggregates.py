"""``lakefold bench aggregates`` at a tiny size: the JSON has the issue's keys, all positive,
and the run checked both sides' balances against the commands (else it exits non-zero)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.timeout(240)
def test_bench_aggregates_reports_every_key() -> None:
    lakefold = str(Path(sys.executable).parent / "lakefold")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}
    out = subprocess.run([lakefold, "bench", "aggregates", "--json", "--accounts", "20",
                          "--writers", "4", "--commands", "10", "--rounds", "3"],
                         capture_output=True, text=True, timeout=230, env=env)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["benchmark"] == "aggregates"
    assert sorted(report["results"]) == ["commands_per_s", "load_ms_p50",
                                         "load_ms_with_snapshot_p50", "ratio_to_eventsourcing"]
    assert list(report["baseline"]) == ["eventsourcing_commands_per_s"]
    values = [*report["results"].values(), *report["baseline"].values()]
    assert all(isinstance(v, int | float) and v > 0 for v in values), report
    assert report["params"]["writers"] == 4
