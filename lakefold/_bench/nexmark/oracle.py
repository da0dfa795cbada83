"""The oracle: each query's final rows computed in batch by DuckDB over the events' Parquet
files, under lakefold's documented semantics (README § Windows).

- Windows are aligned to the epoch in UTC; a tumbling window of 10 s holds the events of
  ``[start, start + 10 s)``, a hopping one of 10 s every 2 s is five such windows.
- A session per bidder holds the bidder's events less than the gap apart: from its first
  event's time to its last one's plus the gap.
- An event is late when the largest event time before it in the log, minus the allowed
  lateness, has passed the end of its window. The generator's disorder is bounded
  (``Config.disorder_bound_ms``) and the bench checks that the bound is below the lateness
  (``check_no_late``), so no event is late and every window holds all of its events: the
  oracle's rows are every window's, final or not (lakefold writes a window's row before it is
  final, with ``window_final``; its rows at the end are compared, not only the final ones).

Rows compare as multisets of the query's ``columns``, normalised by ``normalise``: times as
milliseconds since the epoch, decimals and doubles rounded to 6 digits.
"""

from __future__ import annotations

from collections import Counter
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa

from lakefold._bench.nexmark.generator import Config
from lakefold._bench.nexmark.queries import LATENESS_S, Query
from lakefold._bench.report import BenchmarkError

_VIEWS = """
CREATE VIEW events AS SELECT * REPLACE (dateTime::TIMESTAMP AS dateTime,
                                        a_expires::TIMESTAMP AS a_expires)
    FROM read_parquet('{folder}/*.parquet');
CREATE VIEW person AS SELECT position, p_id AS id, p_name AS name,
    p_emailAddress AS emailAddress, p_creditCard AS creditCard, p_city AS city,
    p_state AS state, dateTime, p_extra AS extra FROM events WHERE event_type = 0;
CREATE VIEW auction AS SELECT position, a_id AS id, a_itemName AS itemName,
    a_description AS description, a_initialBid AS initialBid, a_reserve AS reserve, dateTime,
    a_expires AS expires, a_seller AS seller, a_category AS category, a_extra AS extra
    FROM events WHERE event_type = 1;
CREATE VIEW bid AS SELECT position, b_auction AS auction, b_bidder AS bidder, b_price AS price,
    b_channel AS channel, b_url AS url, dateTime, b_extra AS extra
    FROM events WHERE event_type = 2;
CREATE VIEW bid_tumbles AS SELECT *, window_start + INTERVAL 10 SECOND AS window_end FROM (
    SELECT *, make_timestamp((epoch_ms(dateTime) // 10000 * 10000) * 1000) AS window_start
    FROM bid);
CREATE VIEW person_tumbles AS SELECT *,
    make_timestamp((epoch_ms(dateTime) // 10000 * 10000) * 1000) AS window_start FROM person;
CREATE VIEW auction_tumbles AS SELECT *,
    make_timestamp((epoch_ms(dateTime) // 10000 * 10000) * 1000) AS window_start FROM auction;
CREATE VIEW bid_hops AS SELECT *, make_timestamp(start_ms * 1000) AS starttime FROM (
    SELECT *, (epoch_ms(dateTime) // 2000 - k) * 2000 AS start_ms
    FROM bid, range(0, 5) AS hops(k));
CREATE VIEW bid_sessions AS SELECT *, sum(starts) OVER (PARTITION BY bidder
        ORDER BY dateTime, position ROWS UNBOUNDED PRECEDING) AS session FROM (
    SELECT *, CASE WHEN dateTime - lag(dateTime) OVER (PARTITION BY bidder
        ORDER BY dateTime, position) < INTERVAL 10 SECOND THEN 0 ELSE 1 END AS starts
    FROM bid);
"""


class Oracle:
    """DuckDB over the Parquet files in ``folder``."""

    def __init__(self, folder: Path) -> None:
        import duckdb

        self.db = duckdb.connect()
        self.db.execute("SET TimeZone = 'UTC'").fetchall()
        for statement in _VIEWS.format(folder=str(folder).replace("'", "''")).split(";"):
            if statement.strip():
                self.db.execute(statement).fetchall()

    def rows(self, query: Query) -> Counter[tuple[Any, ...]]:
        """The final rows of ``query``, normalised."""
        table = self.db.sql(query.oracle).to_arrow_table()
        return normalise(table, query.columns)

    def check_no_late(self, config: Config) -> int:
        """The largest lateness (ms) of an event behind the largest earlier event time; fails
        when it reaches the allowed lateness (the oracle would then have to drop it)."""
        rows = self.db.execute("""
            SELECT coalesce(max(before - epoch_ms(dateTime)), 0) FROM (
              SELECT dateTime, max(epoch_ms(dateTime)) OVER (ORDER BY position
                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before FROM events)
            """).fetchall()
        behind = int(rows[0][0]) if rows else 0
        if behind >= LATENESS_S * 1000 or behind > config.disorder_bound_ms:
            raise BenchmarkError(f"an event is {behind} ms behind an earlier one, beyond the "
                                 f"bound of {config.disorder_bound_ms} ms or the lateness of "
                                 f"{LATENESS_S} s; lower --disorder")
        return behind

    def close(self) -> None:
        self.db.close()


def _value(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            return round((value - datetime(1970, 1, 1)).total_seconds() * 1000)
        return round(value.timestamp() * 1000)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, (float, Decimal)):
        return round(float(value), 6)
    return value


def normalise(table: pa.Table, columns: tuple[str, ...]) -> Counter[tuple[Any, ...]]:
    """``columns`` of ``table`` as a multiset of rows (see the module docstring); column
    names match case-insensitively (Spark and Flink keep the query's case, DuckDB may not)."""
    by_lower = {name.lower(): name for name in table.column_names}
    missing = [c for c in columns if c.lower() not in by_lower]
    if missing:
        raise BenchmarkError(f"the result has no column {missing[0]!r} (it has "
                             f"{', '.join(table.column_names)})")
    values = [table.column(by_lower[c.lower()]).to_pylist() for c in columns]
    return Counter(tuple(_value(v) for v in row) for row in zip(*values, strict=True))


def differences(got: Counter[tuple[Any, ...]],
                want: Counter[tuple[Any, ...]]) -> dict[str, Any]:
    """How ``got`` differs from the oracle's ``want``: rows missing and rows extra (counts, and
    up to three examples of each)."""
    missing, extra = want - got, got - want
    return {"rows": sum(got.values()), "expected_rows": sum(want.values()),
            "missing": sum(missing.values()), "extra": sum(extra.values()),
            "missing_examples": [list(map(str, r)) for r in list(missing)[:3]],
            "extra_examples": [list(map(str, r)) for r in list(extra)[:3]]}
