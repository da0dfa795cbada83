"""``lakefold bench replay`` at a tiny size: the JSON shape and positive figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_bench_replay_tiny_run_reports_all_keys():
    out = subprocess.run(
        [sys.executable, "-c", "from lakefold.cli import main; main()", "bench", "replay",
         "--events", "3000", "--per-stream", "100", "--batch-events", "1000", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=230, check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["benchmark"] == "replay"
    assert report["params"]["events"] == 3000
    assert report["results"]["read_events_per_s"] > 0
    rounds = report["params"]["replay_rounds_events_per_s"]
    assert len(rounds) == 2 and report["results"]["replay_events_per_s"] == pytest.approx(
        max(rounds), abs=1)
    assert report["baseline"]["jdbc_read_events_per_s"] > 0
    assert report["machine"]["cores"] >= 1
