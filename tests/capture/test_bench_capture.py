"""``lakefold bench capture`` at a tiny size: the JSON has the documented keys, all positive,
Debezium's embedded engine (from ``make peers``) measured beside."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.timeout(240)
def test_bench_capture_json_shape() -> None:
    cli = Path(sys.executable).parent / "lakefold"
    done = subprocess.run(
        [cli, "bench", "capture", "--json", "--changes", "1000", "--latency-seconds", "1",
         "--backlog-factor", "2"], capture_output=True, text=True, timeout=220, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["benchmark"] == "capture"
    assert report["params"]["changes"] == 1000
    for key in ("changes_per_s_small_txn", "changes_per_s_large_txn", "latency_p50_ms",
                "latency_p99_ms", "peak_rss_mb"):
        assert report["results"][key] > 0, key
    for key in ("pg_recvlogical_changes_per_s_small_txn",
                "pg_recvlogical_changes_per_s_large_txn", "debezium_changes_per_s_small_txn",
                "debezium_changes_per_s_large_txn", "debezium_latency_p50_ms",
                "debezium_latency_p99_ms"):
        assert report["baseline"][key] > 0, key
    for key in ("ratio_to_debezium_small_txn", "ratio_to_debezium_large_txn"):
        assert report["results"][key] > 0, key
    assert report["machine"]["cores"] >= 1


def test_a_peer_without_its_jars_is_one_line_naming_make_peers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Debezium's and Flink's jars come from ``make peers``; where they are not, the bench says
    so in one line before it starts anything."""
    from lakefold._bench import debezium
    from lakefold._bench.nexmark import flink_peer
    from lakefold._bench.report import BenchmarkError

    monkeypatch.setattr(debezium, "JARS", tmp_path / "debezium")
    with pytest.raises(BenchmarkError, match=r"^Debezium's jars are not in .*`make peers`"):
        debezium._argv("host=127.0.0.1 dbname=x user=u", "s", "p", "t", 10, "small")
    monkeypatch.setattr(flink_peer, "JARS", tmp_path / "flink")
    (tmp_path / "flink").mkdir()
    (tmp_path / "flink" / "slf4j-api-1.7.36.jar").write_bytes(b"")  # not the Parquet format
    with pytest.raises(BenchmarkError, match=r"Flink's Parquet jars .* run `make peers`"):
        flink_peer.run_queries([], folder=tmp_path, scratch=tmp_path, events=0,
                               python=Path(sys.executable), collect=False, log=tmp_path / "log")
