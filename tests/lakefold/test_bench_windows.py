"""``lakefold bench windows`` at a tiny size: the JSON has the issue's keys, no event was lost
(the bench computes that from the Delta target and the late-events table, and fails the run on
a loss), the generated late events were listed, and every probe's late event corrected its
window row (the bench fails the run when one does not within 60 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.timeout(240)
def test_bench_windows_reports_every_key_and_loses_nothing() -> None:
    lakefold = str(Path(sys.executable).parent / "lakefold")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}
    out = subprocess.run([lakefold, "bench", "windows", "--json", "--events", "3000",
                          "--keys", "20", "--probes", "5", "--file-events", "1000"],
                         capture_output=True, text=True, timeout=230, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["benchmark"] == "windows"
    results, baseline = report["results"], report["baseline"]
    assert sorted(results) == ["events_lost", "events_per_s", "late_correction_p50_ms",
                               "late_correction_p99_ms", "late_events_listed", "ratio"]
    assert sorted(baseline) == ["spark_events_lost", "spark_rows_dropped",
                                "spark_watermark_events_per_s"]
    assert results["events_lost"] == 0
    assert results["late_events_listed"] == report["params"]["late_events_generated"] > 0
    assert 0 < results["late_correction_p50_ms"] <= results["late_correction_p99_ms"]
    assert results["events_per_s"] > 0 and baseline["spark_watermark_events_per_s"] > 0
    assert results["ratio"] == pytest.approx(
        results["events_per_s"] / baseline["spark_watermark_events_per_s"], rel=0.01)
    assert baseline["spark_rows_dropped"] >= 0 and baseline["spark_events_lost"] >= 0
    assert report["params"]["events"] == 3000 and report["params"]["devices"] == 20
    assert "target" in report["params"]
