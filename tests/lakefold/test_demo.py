"""`lakefold demo` end to end: twice in a row on the embedded default, nothing left running,
and the Delta table (read by an independent reader) equals the aggregate computed on the source."""

import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import psutil
import psycopg
import pytest
from deltalake import DeltaTable

from lakefold import _shop
from lakefold._demo import DEMO_DATABASE, PROJECTION
from lakefold.local import LocalPostgres

LAKEFOLD = str(Path(sys.executable).parent / "lakefold")


def _processes_mentioning(text: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(text in part for part in proc.info["cmdline"] or []):
            found.append(proc)
    return found


@pytest.mark.timeout(400)
def test_demo_twice_matches_the_source_and_leaves_nothing_running(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}
    env["LAKEFOLD_HOME"] = str(tmp_path / "home")
    for _ in range(2):
        out = subprocess.run([LAKEFOLD, "demo", "--rows", "800"], capture_output=True, text=True,
                             env=env, cwd=tmp_path, timeout=180)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "equals the same aggregate computed by SQL on the source" in out.stdout
        assert not _processes_mentioning(str(tmp_path)), "the demo left processes behind"

    table = DeltaTable(str(tmp_path / "home" / "lake" / "demo" / PROJECTION))
    delta_rows = sorted(
        (int(r["customer_id"]), r["name"], int(r["orders"]), Decimal(r["revenue"]))
        for r in table.to_pyarrow_table().to_pylist()
    )
    with LocalPostgres(tmp_path / "home" / "postgres", durable=False) as server:
        server.start()
        with psycopg.connect(server.dsn(DEMO_DATABASE)) as conn:
            expected = _shop.revenue_per_customer(conn)
    assert delta_rows == expected
    assert len(expected) > 100
