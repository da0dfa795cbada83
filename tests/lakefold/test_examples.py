"""The examples run as the docs say (docs/event-store.md, "Aggregates"), from the repository's
root, and check themselves."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_the_bank_example_runs_and_its_view_equals_its_aggregates(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}
    env["LAKEFOLD_HOME"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-m", "examples.bank"], cwd=REPO,
                         capture_output=True, text=True, timeout=280, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("5 accounts, 60 transfers")
    assert lines[-1] == "the balances view equals the aggregates"
