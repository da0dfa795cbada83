"""The Spark driver's class archive: written once in the background, then mapped by every new
driver; a driver that cannot use it (a damaged file) starts without it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lakefold.spark._class_archive import (
    KEPT_ARCHIVES,
    UNUSED_ARCHIVE_DAYS,
    archive_path,
    driver_options,
    prune_unused,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def _driver(java_options: str = "", log: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
    """Start a local driver in a new process: its count of 5 rows and its JVM's arguments;
    the JVM's own output goes to ``log``."""
    log_arg = f", log_path=Path({str(log)!r})" if log else ""
    code = (
        "from pathlib import Path\n"
        "from lakefold.spark import spark_session\n"
        "spark = spark_session('local[1]', conf={'spark.driver.extraJavaOptions': "
        f"{java_options!r}}}{log_arg})\n"
        "print(spark.range(5).count())\n"
        "runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory"
        ".getRuntimeMXBean()\n"
        "print(' '.join(runtime.getInputArguments()))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=240, check=False)


def test_writing_an_archive_keeps_only_the_ones_used_last(tmp_path: Path) -> None:
    """Each virtual environment has an archive of its own (180 MB): the ones used last stay, the
    others and any unused for a week go, whatever the count of environments made."""
    now = time.time()
    archives = [tmp_path / f"spark-driver-{i:016x}.jsa" for i in range(6)]
    for age, archive in enumerate(archives):
        archive.write_bytes(b"x")
        os.utime(archive, (now - age * 60, now - age * 60))  # archives[0] used last
    new = tmp_path / "spark-driver-ffffffffffffffff.jsa"
    new.write_bytes(b"x")
    os.utime(new, (now - 86_400, now - 86_400))
    old = archives[1]
    os.utime(old, (now - (UNUSED_ARCHIVE_DAYS + 1) * 86_400,) * 2)
    (tmp_path / "spark-driver-ffffffffffffffff.lock").write_bytes(b"")  # not an archive

    prune_unused(tmp_path, keep=new)

    left = sorted(p.name for p in tmp_path.glob("*.jsa"))
    assert len(left) == KEPT_ARCHIVES
    assert left == sorted([new.name, archives[0].name, archives[2].name][:KEPT_ARCHIVES])
    assert (tmp_path / "spark-driver-ffffffffffffffff.lock").exists()


def test_the_archive_is_written_once_then_mapped_and_a_damaged_one_is_passed_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("LAKEFOLD_CLASS_ARCHIVE", raising=False)
    path = archive_path({})
    assert path is not None and path.is_relative_to(tmp_path)
    assert archive_path({"spark.jars": "/opt/extra.jar"}) != path  # another class path

    path.parent.mkdir(parents=True)
    stale = path.with_name("spark-driver-0123456789abcdef.jsa")  # left by an older pyspark
    stale.write_bytes(b"old")
    week_ago = time.time() - (UNUSED_ARCHIVE_DAYS + 1) * 86_400
    os.utime(stale, (week_ago, week_ago))

    assert driver_options({}) == ""  # none yet: a background process starts writing it
    lock = path.with_suffix(".lock")
    assert lock.exists()
    assert driver_options({}) == ""  # still none, and no second writer while the lock stands
    deadline = time.monotonic() + 240
    while (lock.exists() or not path.is_file()) and time.monotonic() < deadline:
        time.sleep(0.5)
    # no scratch file, no lock left, and the archive unused for a week deleted
    assert sorted(path.parent.iterdir()) == [path]
    os.utime(path, (week_ago, week_ago))
    assert driver_options({}).startswith(f"-XX:SharedArchiveFile={path} ")
    assert path.stat().st_mtime > time.time() - 60  # marked used: pruning spares it

    # -Xshare:on makes the JVM refuse to start unless it maps the archive
    mapped = _driver("-Xshare:on")
    assert mapped.returncode == 0, mapped.stderr[-2000:]
    count, arguments = mapped.stdout.splitlines()[-2:]
    assert count == "5" and f"-XX:SharedArchiveFile={path}" in arguments

    path.chmod(0o644)
    path.write_bytes(b"not a class archive" * 1000)
    log = tmp_path / "driver.log"
    damaged = _driver(log=log)
    assert damaged.returncode == 0, damaged.stderr[-2000:]
    assert damaged.stdout.splitlines()[-2] == "5"
    # no warning either (the JVM's own output goes to the driver log)
    assert "shared archive" not in damaged.stdout + damaged.stderr + log.read_text()

    monkeypatch.setenv("LAKEFOLD_CLASS_ARCHIVE", "off")
    assert driver_options({}) == ""


def test_a_failed_attempt_is_not_repeated_at_every_session(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    java_home = tmp_path / "jdk"
    (java_home / "bin").mkdir(parents=True)
    java = java_home / "bin" / "java"
    java.write_text("#!/bin/sh\necho 'not a JVM' >&2\nexit 1\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(java_home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("LAKEFOLD_CLASS_ARCHIVE", raising=False)
    path = archive_path({})
    assert path is not None
    lock, failed = path.with_suffix(".lock"), path.with_suffix(".failed")

    assert driver_options({}) == ""
    deadline = time.monotonic() + 120
    while lock.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert failed.exists() and not path.exists() and not lock.exists()
    assert driver_options({}) == ""
    assert not lock.exists()  # no second attempt started
