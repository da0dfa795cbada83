"""Debezium's embedded engine as the capture peer of ``lakefold bench capture``:
``DebeziumPeer.java`` (beside this module) run by Java's source launcher with the jars
``make peers`` fetched through Maven (``infra/peers/debezium/pom.xml``) into ``JARS``.

Each run drains an existing pgoutput slot (created before the workload, like the
``pg_recvlogical`` baseline's) into a consumer that only counts the change events
(``Connect`` format: Kafka Connect ``SourceRecord``s, no serialization), offsets in memory.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from lakefold._bench.report import BenchmarkError
from lakefold.core.fetched_jars import PEERS_DIR, fetched_jars

JARS = PEERS_DIR / "debezium"
SOURCE = Path(__file__).with_name("DebeziumPeer.java")


def _argv(dsn: str, slot: str, publication: str, table: str, changes: int,
          mode: str) -> list[str]:
    if fetched_jars(JARS, ["debezium-embedded-", "debezium-connector-postgres-"])[1]:
        raise BenchmarkError(f"Debezium's jars are not in {JARS}; run `make peers` (Maven "
                             "fetches them once)")
    info = conninfo_to_dict(dsn)
    return ["java", "-Xmx1g", "-cp", f"{JARS}/*", str(SOURCE), str(info.get("host")),
            str(info.get("port", 5432)), str(info.get("user")), str(info.get("dbname")),
            slot, publication, table, str(changes), mode]


def throughput(dsn: str, slot: str, publication: str, table: str, changes: int) -> float:
    """Seconds Debezium's engine takes, from its start, to consume ``changes`` change events
    from ``slot`` (the JVM's own start excepted)."""
    done = subprocess.run(_argv(dsn, slot, publication, table, changes, "throughput"),  # noqa: S603
                          capture_output=True, text=True, timeout=3600, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise BenchmarkError(f"Debezium's engine failed (exit {done.returncode}): "
                             f"{done.stderr.strip()[-800:]}")
    return float(json.loads(lines[-1])["seconds"])


def latency(dsn: str, slot: str, publication: str, table: str, changes: int,
            warm_up: Callable[[], None], load: Callable[[], None]) -> tuple[float, float]:
    """(p50, p99) ms from a transaction's commit to Debezium's consumer holding its last
    change: ``warm_up`` writes one change, then, once the engine has consumed it, ``load``
    writes the ``changes`` measured."""
    process = subprocess.Popen(_argv(dsn, slot, publication, table, changes, "latency"),  # noqa: S603
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stderr is not None  # noqa: S101
    errors: list[str] = []
    drain = threading.Thread(target=lambda: errors.extend(process.stderr or []), daemon=True)
    drain.start()
    try:
        warm_up()
        line = process.stdout.readline().strip()
        if line != "ready":
            raise BenchmarkError(f"Debezium's engine did not start: {''.join(errors)[-800:]}")
        load()
        out = process.stdout.read()
        process.wait(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    lines = out.strip().splitlines()
    if process.returncode != 0 or not lines:
        raise BenchmarkError(f"Debezium's engine failed (exit {process.returncode}): "
                             f"{''.join(errors)[-800:]}")
    found = json.loads(lines[-1])
    return float(found["p50_ms"]), float(found["p99_ms"])
