"""History: lag and throughput sampled from the overview and kept in the store
(``lakefold.console_samples``), so the charts survive a restart of the console.

A sample is (time, subject, metric, value): subject ``projection:NAME``, ``capture:SLOT`` or
``eventstore``; metric ``lag_records``, ``lag_seconds``, ``throughput_per_s``,
``lag_bytes``, ``changes_per_s``, ``events_per_s``. Samples older than ``keep`` are deleted as
new ones are written.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg

from lakefold.core import migrations
from lakefold.core.migrations import Migration

DDL = [
    """CREATE TABLE IF NOT EXISTS lakefold.console_samples (
        sampled_at timestamptz NOT NULL,
        subject text NOT NULL,
        metric text NOT NULL,
        value double precision NOT NULL,
        PRIMARY KEY (subject, metric, sampled_at))""",
    """CREATE INDEX IF NOT EXISTS console_samples_time
        ON lakefold.console_samples (sampled_at)""",
    """CREATE TABLE IF NOT EXISTS lakefold.console_audit (
        id bigserial PRIMARY KEY,
        at timestamptz NOT NULL DEFAULT now(),
        who text NOT NULL,
        action text NOT NULL,
        subject text NOT NULL,
        detail jsonb NOT NULL DEFAULT '{}',
        outcome text NOT NULL)""",
]
COMPONENT = migrations.register(
    "console", Migration(1, "console samples and audit", *DDL))


def install_console_tables(store_dsn: str) -> None:
    """Create the console's tables (samples, audit) in schema ``lakefold`` if missing
    (migrates component ``console``)."""
    with psycopg.connect(store_dsn, autocommit=True, connect_timeout=10) as conn:
        migrations.migrate(conn, COMPONENT)


def samples_of(overview: dict[str, Any]) -> list[tuple[str, str, float]]:
    """(subject, metric, value) of everything the charts draw, from one overview."""
    found: list[tuple[str, str, float]] = []
    for entry in overview["projections"]:
        subject = f"projection:{entry['name']}"
        found += [(subject, "lag_records", float(entry["lag_records"])),
                  (subject, "lag_seconds", float(entry["lag_seconds"])),
                  (subject, "throughput_per_s", float(entry["throughput_per_s"]))]
    for capture in overview["captures"]:
        subject = f"capture:{capture['slot']}"
        found += [(subject, "lag_bytes", float(capture["lag_bytes"] or 0)),
                  (subject, "lag_seconds", float(capture["lag_seconds"] or 0)),
                  (subject, "changes_per_s", float(capture["changes_per_s"]))]
    store = overview["event_store"]
    found += [("eventstore", "events_per_s", float(store["events_per_s"])),
              ("eventstore", "head", float(store["head"]))]
    return found


def write_samples(store_dsn: str, at: dt.datetime, samples: list[tuple[str, str, float]], *,
                  keep: dt.timedelta) -> None:
    """Store one sampling of every subject, and forget those older than ``keep``."""
    with psycopg.connect(store_dsn, autocommit=True, connect_timeout=10) as conn, \
            conn.transaction():
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO lakefold.console_samples (sampled_at, subject, metric, value) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                [(at, subject, metric, value) for subject, metric, value in samples])
        conn.execute("DELETE FROM lakefold.console_samples WHERE sampled_at < %s",
                     (at - keep,))


def sample_time(now: dt.datetime, every_s: float) -> dt.datetime:
    """``now`` rounded down to a multiple of ``every_s``: two consoles on one store sampling
    at the same interval write the same times, and the second one's rows are dropped as
    duplicates instead of doubling every series."""
    step = max(1.0, every_s)
    return dt.datetime.fromtimestamp(now.timestamp() // step * step, tz=dt.UTC)


def read_history(store_dsn: str, *, subject: str | None, minutes: float,
                 since: dt.datetime | None = None) -> dict[str, dict[str, list[list[Any]]]]:
    """The samples of the last ``minutes`` (of one subject, or all; only those after
    ``since`` when given), as ``{subject: {metric: [[iso time, value], ...]}}`` in time
    order."""
    oldest = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=minutes)
    if since is not None:
        since = since if since.tzinfo else since.replace(tzinfo=dt.UTC)
    since = max(oldest, since) if since is not None else oldest
    with psycopg.connect(store_dsn, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT subject, metric, sampled_at, value FROM lakefold.console_samples "
            "WHERE sampled_at > %(since)s AND (%(subject)s::text IS NULL OR subject = "
            "%(subject)s) ORDER BY subject, metric, sampled_at",
            {"since": since, "subject": subject}).fetchall()
    series: dict[str, dict[str, list[list[Any]]]] = {}
    for who, metric, at, value in rows:
        series.setdefault(who, {}).setdefault(metric, []).append([at.isoformat(), value])
    return series
