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


@pytest.mark.slow
def test_rebuild_bench_on_a_cluster_and_a_bucket(cluster, s3_lake, tmp_path):
    """--master and --lake: the same figures measured on a standalone cluster with the tables
    and checkpoints in a bucket, beside the local ones, in one JSON."""
    import os

    import pyarrow.fs as pafs

    from lakefold.core.object_store import filesystem_for

    lakefold = str(Path(sys.executable).with_name("lakefold"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}
    env |= {k: v for k, v in s3_lake.environment().items()
            if k not in ("LAKEFOLD_S3_BUCKET", "LAKEFOLD_S3_PREFIX")}
    out = subprocess.run(
        [lakefold, "bench", "rebuild", "--events", "3000", "--customers", "10", "--batch",
         "1000", "--master", cluster.url, "--lake", f"{s3_lake.uri}/bench", "--json"],
        capture_output=True, text=True, timeout=280, check=False, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["params"]["master"] == cluster.url
    assert report["results"]["rebuild_events_per_s"] > 0
    assert report["results"]["cluster+s3"]["rebuild_events_per_s"] > 0
    assert report["baseline"]["cluster+s3"]["batch_aggregate_events_per_s"] > 0
    assert report["params"]["cluster+s3_initial_build_events_per_s"] > 0
    assert any(p.name.startswith("app-") for p in cluster.work_dir(0).iterdir())
    assert s3_lake.server.secret_access_key not in out.stdout + out.stderr
    fs, root = filesystem_for(f"{s3_lake.uri}/bench")  # the run's prefix is removed
    left = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    assert [info.path for info in left if info.type == pafs.FileType.File] == []
