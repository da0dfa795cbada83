"""A Spark command prints its answer and nothing of Spark's: the driver JVM's own output (the
"Using incubator modules" warning, log4j's start-up lines, the stack traces of a driver
orphaned by a SIGKILL) goes to ``$LAKEFOLD_HOME/logs/spark-driver.log``, and an error says
where that log is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from lakefold.eventstore import EventStore
from lakefold.schemas.events import NewEvent
from tests.fixtures.postgres import TestDatabase

LAKEFOLD = str(Path(sys.executable).parent / "lakefold")
MODULE = str(Path(__file__).parents[1] / "projections" / "new_system_projections.py")
pytestmark = pytest.mark.timeout(240)


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}
    # No background archive writer: it would outlive the test.
    return env | {"LAKEFOLD_HOME": str(home), "LAKEFOLD_CLASS_ARCHIVE": "off"} | extra


def test_a_spark_command_prints_only_its_answer(tmp_path: Path) -> None:
    home = tmp_path / "home"
    out = subprocess.run([LAKEFOLD, "query", "SELECT 1 AS one", "--format", "csv"],
                         capture_output=True, text=True, env=_env(home), cwd=tmp_path,
                         timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "one\n1\n"
    assert out.stderr == ""
    log = home / "logs" / "spark-driver.log"
    assert log.is_file()  # what Spark had to say is kept there

    bad = subprocess.run([LAKEFOLD, "query", "SELEKT 1"], capture_output=True, text=True,
                         env=_env(home), cwd=tmp_path, timeout=180)
    assert bad.returncode == 1 and bad.stdout == ""
    lines = bad.stderr.strip().splitlines()
    assert lines[0].startswith("error: cannot parse the query"), bad.stderr
    assert lines[-1] == f"(Spark's own log: {log})"
    assert "at org.apache" not in bad.stderr and "WARNING" not in bad.stderr


def test_an_orphaned_driver_writes_nothing_to_the_terminal(pg: TestDatabase,
                                                          tmp_path: Path) -> None:
    """SIGKILL a runner: its driver JVM notices its input closing and exits with stack traces,
    which go to the driver log, not into the output the runner shared with its caller."""
    with EventStore(pg.dsn) as store:
        store.install()
        store.append("acct-1", [NewEvent("Deposited", {"amount": 1})])
    home = tmp_path / "home"
    runner = subprocess.Popen(  # the terminal: one pipe for both, as a shell gives
        [LAKEFOLD, "run", "-p", MODULE, "--trigger", "0.2"], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, env=_env(home, LAKEFOLD_STORE_DSN=pg.dsn), cwd=tmp_path)
    try:
        assert runner.stdout is not None
        before: list[str] = []  # what came before the runner's first line
        while not (line := runner.stdout.readline().decode()).startswith("running balances"):
            assert line, f"the runner ended: {''.join(before)}"
            before.append(line)
        time.sleep(3)  # a few batches
        jvms = [p for p in psutil.Process(runner.pid).children(recursive=True)
                if "java" in p.name()]
        assert jvms, "no driver JVM"
        runner.send_signal(signal.SIGKILL)
        rest, _ = runner.communicate(timeout=120)  # until every writer of the pipe is gone
        _, alive = psutil.wait_procs(jvms, timeout=60)
        assert not alive, "the orphaned driver did not exit"
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    assert rest.decode().strip() == "", rest.decode()[:3000]
    assert before == []
