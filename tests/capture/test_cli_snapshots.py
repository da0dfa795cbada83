"""``lakefold capture status|resnapshot|pause|resume`` from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from lakefold.capture import CaptureConfig, ChangelogStore
from lakefold.cli import app
from tests.capture.conftest import capture_now, execute
from tests.fixtures.postgres import TestDatabase

CLI = Path(sys.executable).parent / "lakefold"


def _cli(*args: str) -> Result:
    """In-process, for speed (the real process is tested once, for the error path)."""
    return CliRunner().invoke(app, ["capture", *args])


def _process(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, "capture", *args], capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.mark.timeout(180)
def test_status_resnapshot_pause_resume(pg: TestDatabase) -> None:
    execute(pg.dsn, "CREATE TABLE t (id int PRIMARY KEY, v int)",
            "CREATE TABLE other (id int PRIMARY KEY)",
            "INSERT INTO t SELECT g, g FROM generate_series(1, 3000) g")
    missing = _cli("status", "--dsn", pg.dsn, "--slot", "cli", "--json")
    assert missing.exit_code == 2 and json.loads(missing.stdout)["status"] == "missing"

    config = CaptureConfig(source_dsn=pg.dsn, tables=("t",), slot="cli", publication="cli")
    capture_now(config)
    status = _cli("status", "--dsn", pg.dsn, "--slot", "cli", "--json")
    assert status.exit_code == 0, status.output
    report = json.loads(status.stdout)
    assert report["slot"] == "cli" and report["exists"] and report["records"] == 3000
    for key in ("confirmed_lsn_text", "lag_bytes", "lag_seconds", "wal_status",
                "safe_wal_size", "active", "paused", "last_error", "problems"):
        assert key in report
    human = _cli("status", "--dsn", pg.dsn, "--slot", "cli")
    assert "wal_status" in human.stdout and "reserved" in human.stdout

    done = _cli("resnapshot", "public.t", "--dsn", pg.dsn, "--slot", "cli", "--publication",
                "cli", "--chunk-rows", "500", "--json")
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout)
    assert result["rows"] == 3000 and result["chunks"] >= 6 and result["rows_per_s"] > 0
    capture_now(config)
    with ChangelogStore(pg.dsn) as store:
        assert store.head("public.t") == 6000

    refused = _process("resnapshot", "public.other", "--dsn", pg.dsn, "--slot", "cli",
                   "--publication", "cli")
    assert refused.returncode == 1
    assert "not captured" in refused.stderr and len(refused.stderr.strip().splitlines()) <= 3

    assert _cli("pause", "--store-dsn", pg.dsn, "--slot", "cli").exit_code == 0
    paused = json.loads(_cli("status", "--dsn", pg.dsn, "--slot", "cli", "--json").stdout)
    assert paused["paused"] and any("paused" in p for p in paused["problems"])
    assert _cli("resume", "--store-dsn", pg.dsn, "--slot", "cli").exit_code == 0
    resumed = json.loads(_cli("status", "--dsn", pg.dsn, "--slot", "cli", "--json").stdout)
    assert not resumed["paused"]
