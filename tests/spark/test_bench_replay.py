"""``lakefold bench replay`` at a tiny size: the JSON shape and positive figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_replay_reports_every_key_here_and_on_a_cluster_and_a_bucket(cluster, s3_lake,
                                                                          tmp_path):
    """The replay bench's figures, and with --master and --lake the reads and replays
    measured again on a standalone cluster with the replays' tables and checkpoints in a
    bucket, in one JSON; the run's prefix in the bucket is removed afterwards."""
    import os

    import pyarrow.fs as pafs

    from lakefold.core.object_store import filesystem_for

    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}
    env |= {k: v for k, v in s3_lake.environment().items()
            if k not in ("LAKEFOLD_S3_BUCKET", "LAKEFOLD_S3_PREFIX")}
    out = subprocess.run(
        [sys.executable, "-c", "from lakefold.cli import main; main()", "bench", "replay",
         "--events", "3000", "--per-stream", "100", "--batch-events", "1000",
         "--master", cluster.url, "--lake", f"{s3_lake.uri}/bench", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=290, check=False, env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["benchmark"] == "replay"  # the local figures
    assert report["params"]["events"] == 3000 and report["params"]["master"] == cluster.url
    assert report["results"]["read_events_per_s"] > 0
    rounds = report["params"]["replay_rounds_events_per_s"]
    assert len(rounds) == 2 and report["results"]["replay_events_per_s"] == pytest.approx(
        max(rounds), abs=1)
    assert report["baseline"]["jdbc_read_events_per_s"] > 0
    assert report["machine"]["cores"] >= 1
    there = report["results"]["cluster+s3"]
    assert there["read_events_per_s"] > 0 and there["replay_events_per_s"] > 0
    assert report["baseline"]["cluster+s3"]["jdbc_read_events_per_s"] > 0
    assert len(report["params"]["cluster+s3"]["replay_rounds_events_per_s"]) == 2
    assert any(p.name.startswith("app-") for p in cluster.work_dir(0).iterdir())
    assert s3_lake.server.secret_access_key not in out.stdout + out.stderr
    fs, root = filesystem_for(f"{s3_lake.uri}/bench")
    left = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    assert [info.path for info in left if info.type == pafs.FileType.File] == []
