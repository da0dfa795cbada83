"""The CLI answers --help, and bad settings give one line saying what to fix, not a traceback."""

import os
import subprocess
import sys
from pathlib import Path

from lakefold.local import free_port

LAKEFOLD = str(Path(sys.executable).parent / "lakefold")


def _run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
         ) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAKEFOLD_")}
    return subprocess.run([LAKEFOLD, *args], capture_output=True, text=True, timeout=120,
                          env=clean | (env or {}), cwd=cwd)


def test_help_lists_the_commands() -> None:
    out = _run("--help")
    assert out.returncode == 0
    for command in ("demo", "bench"):
        assert command in out.stdout


def test_misspelt_setting_is_one_line(tmp_path: Path) -> None:
    out = _run("demo", env={"LAKEFOLD_DNS": "host=x"}, cwd=tmp_path)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0, out.stderr
    assert "unknown setting LAKEFOLD_DNS" in out.stderr


def test_unreachable_dsn_is_one_line_and_masks_the_password(tmp_path: Path) -> None:
    dsn = f"host=127.0.0.1 port={free_port()} user=app password=hunter2 connect_timeout=2"
    out = _run("demo", env={"LAKEFOLD_DSN": dsn}, cwd=tmp_path)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert "hunter2" not in out.stderr + out.stdout
    assert "cannot connect to PostgreSQL" in out.stderr
    assert "LAKEFOLD_DSN" in out.stderr
