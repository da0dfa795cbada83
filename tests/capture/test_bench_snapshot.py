"""``lakefold bench snapshot`` at a tiny size: the JSON report has the agreed keys and
positive numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.timeout(180)
def test_bench_snapshot_json_shape() -> None:
    cli = Path(sys.executable).parent / "lakefold"
    done = subprocess.run([cli, "bench", "snapshot", "--json", "--rows", "3000",
                           "--chunk-rows", "500"], capture_output=True, text=True, timeout=170,
                          check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["benchmark"] == "snapshot" and report["params"]["rows"] == 3000
    assert report["results"]["rows_per_s"] > 0
    assert report["results"]["incremental_rows_per_s"] > 0
    assert report["baseline"]["copy_to_stdout_rows_per_s"] > 0
    assert report["machine"]["cores"] >= 1
