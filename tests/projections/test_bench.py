"""The projection benchmarks run at a tiny size and print the agreed JSON shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(300)
TABLES = ("public.orders", "public.customers", "public.products")


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


@pytest.mark.slow
def test_views_bench_shape(cluster, s3_lake, tmp_path):
    """The views bench's figures, and the same again with a second chain on a standalone
    cluster with its Delta tables in a bucket (--master, --lake), in one JSON."""
    report = bench_elsewhere(cluster, s3_lake, tmp_path, "views", "--orders", "2000",
                             "--customers", "200", "--products", "100", "--seconds", "4",
                             "--warmup", "1", "--rate", "100", "--probes", "2")
    away = report["results"]["cluster+s3"]
    for metric in ("rebuild_rows_per_s", "batch_s", "batch_cost_ratio", "empty_batch_s"):
        assert away[metric] > 0, metric
    assert report["baseline"]["cluster+s3"]["full_recompute_s"] > 0
    results = report["results"]
    assert isinstance(results, dict)
    for metric in ("rebuild_rows_per_s", "batch_s", "batch_cost_ratio", "empty_batch_s",
                   "view_p50_ms", "view_p99_ms"):
        assert results[metric] > 0, metric
    assert report["baseline"]["full_recompute_s"] > 0
    assert report["params"]["probes_missed"] == 0
    store = results["store"]  # what the store keeps, per view and per input row
    assert store["changelog_bytes"] > 0 and store["changelog_bytes_per_row"] > 0
    rows = 2000 + 200 + 100
    for name, inputs in (("order_lines", rows), ("revenue_by_city", 2000)):
        view = store["views"][name]
        assert view["input_rows"] == inputs, name
        # every view keeps its inputs' rows in state tables and writes an output stream
        # (revenue_by_city's 50 rows may fit in the changelog's last page: no growth)
        assert view["state_table_bytes"] > 0 and view["stream_bytes"] >= 0, (name, view)
        assert view["store_bytes"] >= view["state_table_bytes"], (name, view)
        assert view["bytes_per_input_row"] == round(view["store_bytes"] / inputs, 1), name
        # its latest-rows tables by stream: its inputs' and its own output's
        assert all(size > 0 for size in view["state_tables"].values()), (name, view)
    assert set(store["views"]["order_lines"]["state_tables"]) == {
        *TABLES, "lakefold_views.order_lines_g1"}
    assert "lakefold_views.order_lines_g1" in store["views"]["revenue_by_city"]["state_tables"]
    assert store["views"]["order_lines"]["stream_bytes"] > 0  # 2,000 lines
    assert store["views_bytes"] == sum(v["store_bytes"] for v in store["views"].values())
    assert store["views_bytes_per_input_row"] == round(store["views_bytes"] / rows, 1)
    assert store["bytes_per_change_under_load"] > 0


def bench_elsewhere(cluster: Any, s3_lake: Any, cwd: Path, *args: str) -> dict[str, Any]:
    """``lakefold bench ARGS --master CLUSTER --lake BUCKET/bench --json``: its report, after
    checking that the jobs ran on the cluster, no secret was printed and the run's prefix in
    the bucket is gone."""
    import os

    import pyarrow.fs as pafs

    from lakefold.core.object_store import filesystem_for

    lakefold = str(Path(sys.executable).with_name("lakefold"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}
    env |= {k: v for k, v in s3_lake.environment().items()
            if k not in ("LAKEFOLD_S3_BUCKET", "LAKEFOLD_S3_PREFIX")}
    out = subprocess.run(
        [lakefold, "bench", *args, "--master", cluster.url, "--lake", f"{s3_lake.uri}/bench",
         "--json"], capture_output=True, text=True, timeout=280, check=False, env=env, cwd=cwd)
    assert out.returncode == 0, out.stderr[-2000:]
    report: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["params"]["master"] == cluster.url
    assert any(p.name.startswith("app-") for p in cluster.work_dir(0).iterdir())
    assert s3_lake.server.secret_access_key not in out.stdout + out.stderr
    fs, root = filesystem_for(f"{s3_lake.uri}/bench")  # the run's prefix is removed
    left = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    assert [info.path for info in left if info.type == pafs.FileType.File] == []
    return report


@pytest.mark.slow
def test_rebuild_bench_shape_here_and_on_a_cluster_and_a_bucket(cluster, s3_lake, tmp_path):
    """The rebuild bench's figures, and with --master and --lake the same measured on a
    standalone cluster with the tables and checkpoints in a bucket, in one JSON."""
    report = bench_elsewhere(cluster, s3_lake, tmp_path, "rebuild", "--events", "3000",
                             "--customers", "10", "--batch", "1000")
    assert report["results"]["rebuild_events_per_s"] > 0  # the local figures
    assert report["baseline"]["batch_aggregate_events_per_s"] > 0
    assert report["results"]["cluster+s3"]["rebuild_events_per_s"] > 0
    assert report["baseline"]["cluster+s3"]["batch_aggregate_events_per_s"] > 0
    assert report["params"]["cluster+s3_initial_build_events_per_s"] > 0
