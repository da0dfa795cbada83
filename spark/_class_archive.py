"""A class-data-sharing archive of the Spark driver JVM, so that a driver starts faster.

A driver JVM loads and verifies some 15,000 classes while it starts. A dynamic CDS archive
holds them already parsed, mapped from one file: on the 2-core machine a local session's start
went from 7.7-8.4 s to 4.9-5.4 s (measured 2026-11-22). Every ``lakefold`` command that starts Spark
pays that start, and so does every restart of a streaming driver after a crash.

JDK 17 writes such an archive only when a JVM exits (``-XX:ArchiveClassesAtExit``). So the first
session that finds no archive starts a detached background process (``python -m
lakefold.spark._class_archive_training``). That process starts a driver with the same class
path, runs what lakefold's sessions run (``_train``: a Python data source read in batch and as a
stream, an aggregation, a join, the Delta sink and reader, SQL) on a few thousand generated
rows, stops the driver, and waits for the JVM to exit (about 40 s in all). The JVM writes the
archive to a scratch name, which is then renamed into place. Sessions after that pass
``-XX:SharedArchiveFile``. Classes the training did not load are loaded from the jars as usual:
a first streaming replay loaded ~4,900 of them when the training was one small job.

The archive's name is a hash of everything its classes depend on: the ``java`` binary, the
pyspark jars and the session's extra jars. A JVM that still finds it unusable starts as usual,
only without the speed-up. A failed attempt to write it is not repeated for a day.
``LAKEFOLD_CLASS_ARCHIVE=off`` turns all of this off.

Each archive is some 180 MB, and an upgrade of pyspark or Java, another ``spark.jars`` or a new
training makes a new one: a session that maps an archive marks it used (its mtime, at most
hourly), and writing a new archive deletes those unused for ``UNUSED_ARCHIVE_DAYS`` and all
but the ``KEPT_ARCHIVES`` used last. (Each virtual environment has its own: a machine that made a
fresh clone every hour had 23 of them, 4 GB, in a day, and its disk filled.)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

# Settings that change the driver's class path; the archive is only valid for the same one.
CLASS_PATH_CONF: Final = ("spark.jars", "spark.driver.extraClassPath")
QUIET: Final = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # a mismatch is not worth a warning
_STALE_LOCK_S: Final = 600.0
_RETRY_FAILED_S: Final = 86_400.0
_DETACH: Final = "import subprocess, sys; subprocess.Popen(sys.argv[1:], start_new_session=True)"
# Part of the archive's name: a new training (_class_archive_training._train), a new archive.
_TRAINING: Final = "training 2"
UNUSED_ARCHIVE_DAYS: Final = 7
KEPT_ARCHIVES: Final = 3  # the new one included
_MARK_USED_S: Final = 3_600.0


def _directory() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "lakefold" / "jvm"


def archive_path(conf: Mapping[str, str]) -> Path | None:
    """Where the archive for a driver with ``conf`` lives (None: no ``java`` found)."""
    import pyspark

    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home, "bin", "java")) if java_home else shutil.which("java")
    if java is None:
        return None
    jars = Path(pyspark.__file__).parent / "jars"
    parts = [_TRAINING, os.path.realpath(java), pyspark.__version__,
             *sorted(p.name for p in jars.glob("*.jar")),
             *(f"{key}={conf.get(key, '')}" for key in CLASS_PATH_CONF)]
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return _directory() / f"spark-driver-{digest}.jsa"


def driver_options(conf: Mapping[str, str]) -> str:
    """JVM options for a new driver with ``conf``: the archive when there is one (and its
    creation in the background when there is none yet), or nothing."""
    if os.environ.get("LAKEFOLD_CLASS_ARCHIVE", "").lower() in ("0", "off", "false", "no"):
        return ""
    path = archive_path(conf)
    if path is None:
        return ""
    if path.is_file():
        _mark_used(path)
        return f"-XX:SharedArchiveFile={path} {QUIET}"
    _start_creation(path, conf)
    return ""


def _mark_used(path: Path) -> None:
    try:
        if time.time() - path.stat().st_mtime > _MARK_USED_S:
            os.utime(path)  # read-only files may still have their times set by their owner
    except OSError:
        pass  # another user's archive: it stays, and mapping it works all the same


def prune_unused(directory: Path, *, keep: Path) -> None:
    """Delete the archives in ``directory`` but ``keep`` not used for ``UNUSED_ARCHIVE_DAYS``,
    and all but the ``KEPT_ARCHIVES - 1`` others used last."""
    cutoff = time.time() - UNUSED_ARCHIVE_DAYS * 86_400
    used: list[tuple[float, Path]] = []
    for archive in directory.glob("spark-driver-*.jsa"):
        try:
            if archive != keep:
                used.append((archive.stat().st_mtime, archive))
        except OSError:
            continue
    used.sort(reverse=True)
    for rank, (mtime, archive) in enumerate(used):
        if mtime < cutoff or rank >= KEPT_ARCHIVES - 1:
            archive.unlink(missing_ok=True)


def _start_creation(path: Path, conf: Mapping[str, str]) -> None:
    """Start the background process that writes ``path``, unless one is at work."""
    path.parent.mkdir(parents=True, exist_ok=True)
    failed = path.with_suffix(".failed")
    if failed.exists() and time.time() - failed.stat().st_mtime < _RETRY_FAILED_S:
        return  # the last attempt failed (a JVM without CDS?): not again for a while
    lock = path.with_suffix(".lock")
    try:
        if time.time() - lock.stat().st_mtime > _STALE_LOCK_S:
            lock.unlink(missing_ok=True)  # its creator died
    except FileNotFoundError:
        pass
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return
    class_path = {key: conf[key] for key in CLASS_PATH_CONF if key in conf}
    # Started through a short-lived intermediate process, so the writer is nobody's child
    # here (no zombie, no Popen left running) and outlives this process in its own session
    # (a kill of this process group spares it).
    subprocess.run(  # noqa: S603 - this interpreter and module, our own arguments
        [sys.executable, "-c", _DETACH, sys.executable, "-m",
         "lakefold.spark._class_archive_training",
         str(path), json.dumps(class_path)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        timeout=60, check=False)
    log.info("writing a class archive of the Spark driver JVM in the background (%s); "
             "later sessions start faster", path)
