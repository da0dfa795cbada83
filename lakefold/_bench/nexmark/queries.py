"""Nexmark's queries, each written for every engine the bench runs: lakefold's views, the
DuckDB oracle, Flink SQL, and (where Spark can maintain it) Spark Structured Streaming.

The SQL follows the Flink community's ``nexmark-flink/src/main/resources/queries``, over the
views ``person``, ``auction`` and ``bid`` of one event table, with these deliberate changes,
the same in every engine so that results compare:

- Flink's ``AVG`` of a ``BIGINT`` is a ``BIGINT``; the averages here are of ``DOUBLE``.
- Top-N and "last" queries (q18, q19) break ties by the event's ``position`` (the events'
  order in the log; Flink's ``ROW_NUMBER`` picks among ties arbitrarily).
- q14's ``count_char`` UDF is ``length(extra) - length(replace(extra, 'c', ''))``.
- q13 (a join with a side-input file by processing time) and q12 (processing-time windows)
  depend on the wall clock, not on the events: no engine's result can be checked, so they are
  listed as not run.

lakefold's views read ``events("nexmark", types=[...])``; an auction's ``category`` is the
payload field ``categoryId`` there, because ``category`` is an event column (the view refuses
a payload field named like one: ``REFUSALS``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: The allowed lateness of every windowed view, and the watermark delay of the peers (Nexmark's
#: DDL declares ``WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND``).
LATENESS_S = 4
CATEGORY = "nexmark"
PERSON_TYPE, AUCTION_TYPE, BID_TYPE = "nexmark.person", "nexmark.auction", "nexmark.bid"

_RANKS = """
     count(*) FILTER (WHERE price < 10000) AS rank1_bids,
     count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
     count(*) FILTER (WHERE price >= 1000000) AS rank3_bids"""
_DISTINCTS = """
     count(DISTINCT bidder) AS total_bidders,
     count(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders,
     count(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders,
     count(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders,
     count(DISTINCT auction) AS total_auctions,
     count(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions,
     count(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000)
         AS rank2_auctions,
     count(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions"""


@dataclass(frozen=True)
class LakefoldView:
    """One view of a query's chain (the last one is the query's result)."""

    name: str
    inputs: dict[str, str]  # alias → "person" | "auction" | "bid" | another view's name
    key: tuple[str, ...]
    query: str
    #: ("tumbling", input.column, size_s) | ("hopping", input.column, size_s, slide_s) |
    #: ("session", input.column, gap_s, by)
    window: tuple[Any, ...] | None = None
    #: This view's output names of the query's ``columns`` (same order), where they differ
    #: (a windowed view's key holds ``window_start`` under that name).
    columns: tuple[str, ...] = ()


@dataclass(frozen=True)
class Query:
    """A Nexmark query in every engine. ``columns``: the result's columns, compared as a
    multiset of rows; ``oracle``: DuckDB SQL of the final rows; ``flink``: a Flink SQL
    SELECT (None: not run, ``flink_note`` says why); ``spark``: a function of the Spark
    event frames returning (streaming frame, output mode), None with ``spark_note`` saying
    why; ``lakefold``: the views (empty: refused, ``lakefold_note`` has the refusal)."""

    name: str
    what: str
    columns: tuple[str, ...]
    oracle: str
    lakefold: tuple[LakefoldView, ...] = ()
    lakefold_note: str = ""
    #: The query as Nexmark writes it, in one view, where that differs from ``lakefold``: the
    #: bench tries it first and reports its refusal (a fix that makes it run shows at once).
    lakefold_native: tuple[LakefoldView, ...] = ()
    flink: str | None = None
    flink_note: str = ""
    spark: Callable[[Any], tuple[Any, str]] | None = None
    spark_note: str = ""
    #: Spark's append mode emits a window only once the watermark passed it: its result is
    #: compared on the windows closed at the end of the input (column of the window's end).
    spark_closed_by: str | None = None
    #: Of a query Spark runs in update mode: the columns of a group (its last update wins).
    spark_keys: tuple[str, ...] = ()
    tags: tuple[str, ...] = field(default=())


def _bid_columns(alias: str = "", quote: str = "") -> str:
    p = f"{alias}." if alias else ""
    return f"{p}auction, {p}bidder, {p}price, {p}{quote}dateTime{quote}, {p}extra"


# ----------------------------------------------------------------------------------- Spark

def _spark_q0(f: Any) -> tuple[Any, str]:
    return f.bid.select("auction", "bidder", "price", "dateTime", "extra"), "append"


def _spark_q1(f: Any) -> tuple[Any, str]:
    return f.bid.selectExpr("auction", "bidder", "0.908 * price AS price", "dateTime",
                            "extra"), "append"


def _spark_q2(f: Any) -> tuple[Any, str]:
    return f.bid.where("auction % 123 = 0").select("auction", "price"), "append"


def _spark_q3(f: Any) -> tuple[Any, str]:
    a = f.auction.where("category = 10").alias("A")
    p = f.person.where("state IN ('OR', 'ID', 'CA')").alias("P")
    return a.join(p, a.seller == p.id).selectExpr("P.name", "P.city", "P.state",
                                                  "A.id"), "append"


def _spark_q10(f: Any) -> tuple[Any, str]:
    return f.bid.selectExpr("auction", "bidder", "price", "dateTime", "extra",
                            "date_format(dateTime, 'yyyy-MM-dd') AS dt",
                            "date_format(dateTime, 'HH:mm') AS hm"), "append"


def _spark_q11(f: Any) -> tuple[Any, str]:
    from pyspark.sql import functions as F

    sessions = (f.bid.withWatermark("dateTime", f"{LATENESS_S} seconds")
                .groupBy("bidder", F.session_window("dateTime", "10 seconds")).count())
    return sessions.selectExpr("bidder", "count AS bid_count",
                               "session_window.start AS starttime",
                               "session_window.end AS endtime"), "append"


def _spark_q14(f: Any) -> tuple[Any, str]:
    return f.bid.where("0.908 * price > 1000000 AND 0.908 * price < 50000000").selectExpr(
        "auction", "bidder", "0.908 * price AS price",
        "CASE WHEN hour(dateTime) >= 8 AND hour(dateTime) <= 18 THEN 'dayTime' "
        "WHEN hour(dateTime) <= 6 OR hour(dateTime) >= 20 THEN 'nightTime' "
        "ELSE 'otherTime' END AS bidTimeType", "dateTime", "extra",
        "length(extra) - length(replace(extra, 'c', '')) AS c_counts"), "append"


def _spark_q17(f: Any) -> tuple[Any, str]:
    from pyspark.sql import functions as F

    day = F.date_format("dateTime", "yyyy-MM-dd").alias("day")
    price = F.col("price")
    return f.bid.groupBy("auction", day).agg(
        F.count(F.lit(1)).alias("total_bids"),
        F.count(F.when(price < 10000, 1)).alias("rank1_bids"),
        F.count(F.when((price >= 10000) & (price < 1000000), 1)).alias("rank2_bids"),
        F.count(F.when(price >= 1000000, 1)).alias("rank3_bids"),
        F.min(price).alias("min_price"), F.max(price).alias("max_price"),
        F.avg(price.cast("double")).alias("avg_price"), F.sum(price).alias("sum_price"),
    ), "update"


def _spark_q20(f: Any) -> tuple[Any, str]:
    b = f.bid.alias("B")
    a = f.auction.where("category = 10").alias("A")
    return b.join(a, b.auction == a.id).selectExpr(
        "B.auction", "B.bidder", "B.price", "B.channel", "B.url", "B.dateTime AS bid_dateTime",
        "B.extra AS bid_extra", "A.itemName", "A.description", "A.initialBid", "A.reserve",
        "A.dateTime AS auction_dateTime", "A.expires", "A.seller", "A.category",
        "A.extra AS auction_extra"), "append"


def _spark_q21(f: Any) -> tuple[Any, str]:
    extract = "nullif(regexp_extract(url, '(&|^)channel_id=([^&]*)', 2), '')"
    return f.bid.where(f"{extract} IS NOT NULL OR lower(channel) IN "
                       "('apple', 'google', 'facebook', 'baidu')").selectExpr(
        "auction", "bidder", "price", "channel",
        "CASE WHEN lower(channel) = 'apple' THEN '0' WHEN lower(channel) = 'google' THEN '1' "
        "WHEN lower(channel) = 'facebook' THEN '2' WHEN lower(channel) = 'baidu' THEN '3' "
        f"ELSE {extract} END AS channel_id"), "append"


def _spark_q22(f: Any) -> tuple[Any, str]:
    return f.bid.selectExpr("auction", "bidder", "price", "channel",
                            "split(url, '/')[3] AS dir1", "split(url, '/')[4] AS dir2",
                            "split(url, '/')[5] AS dir3"), "append"


_NO_RETRACTIONS = ("Spark Structured Streaming has no retractions: {what} in append mode "
                   "needs a watermark-closed window, and update/complete mode is refused "
                   "after a stream-stream join")

# ------------------------------------------------------------------------------ the queries

_BID = {"bid": "bid"}
_Q15_SELECT = f"""
    SELECT {{day}} AS day, count(*) AS total_bids,{_RANKS},{_DISTINCTS}
    FROM bid GROUP BY {{day}}"""
_Q16_SELECT = f"""
    SELECT channel, {{day}} AS day, max({{minute}}) AS minute, count(*) AS total_bids,{_RANKS},
    {_DISTINCTS}
    FROM bid GROUP BY channel, {{day}}"""
_Q17_SELECT = f"""
    SELECT auction, {{day}} AS day, count(*) AS total_bids,{_RANKS},
     min(price) AS min_price, max(price) AS max_price, avg(CAST(price AS DOUBLE)) AS avg_price,
     sum(price) AS sum_price
    FROM bid GROUP BY auction, {{day}}"""
def _flink_names(sql: str) -> str:
    """``day`` and ``minute`` are reserved words in Flink SQL."""
    return sql.replace(" AS day,", " AS `day`,").replace(" AS minute,", " AS `minute`,")


_SPARK_DAY = "date_format(dateTime, 'yyyy-MM-dd')"
_SPARK_MINUTE = "date_format(dateTime, 'HH:mm')"
_DUCK_DAY = "strftime(dateTime, '%Y-%m-%d')"
_DUCK_MINUTE = "strftime(dateTime, '%H:%M')"
_FLINK_DAY = "DATE_FORMAT(`dateTime`, 'yyyy-MM-dd')"
_FLINK_MINUTE = "DATE_FORMAT(`dateTime`, 'HH:mm')"
_Q14_WHERE = "0.908 * price > 1000000 AND 0.908 * price < 50000000"
_Q14_TYPE = ("CASE WHEN hour(dateTime) >= 8 AND hour(dateTime) <= 18 THEN 'dayTime' "
             "WHEN hour(dateTime) <= 6 OR hour(dateTime) >= 20 THEN 'nightTime' "
             "ELSE 'otherTime' END")
_Q21_NAMED = ("CASE WHEN lower(channel) = 'apple' THEN '0' WHEN lower(channel) = 'google' "
              "THEN '1' WHEN lower(channel) = 'facebook' THEN '2' WHEN lower(channel) = "
              "'baidu' THEN '3' ELSE {extract} END")
_Q21_WHERE = ("{extract} IS NOT NULL OR lower(channel) IN ('apple', 'google', 'facebook', "
              "'baidu')")
_SPARK_EXTRACT = "nullif(regexp_extract(url, '(&|^)channel_id=([^&]*)', 2), '')"
_DUCK_EXTRACT = "nullif(regexp_extract(url, '(&|^)channel_id=([^&]*)', 2), '')"
_FLINK_EXTRACT = "REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2)"

QUERIES: tuple[Query, ...] = (
    Query("q0", "pass-through", ("auction", "bidder", "price", "dateTime", "extra"),
          oracle=f"SELECT {_bid_columns()} FROM bid",
          lakefold=(LakefoldView("q0", _BID, ("position",),
                                 f"SELECT position, {_bid_columns()} FROM bid"),),
          flink=f"SELECT {_bid_columns(quote='`')} FROM bid", spark=_spark_q0),
    Query("q1", "currency conversion", ("auction", "bidder", "price", "dateTime", "extra"),
          oracle="SELECT auction, bidder, 0.908 * price AS price, dateTime, extra FROM bid",
          lakefold=(LakefoldView("q1", _BID, ("position",),
                                 "SELECT position, auction, bidder, 0.908 * price AS price, "
                                 "dateTime, extra FROM bid"),),
          flink="SELECT auction, bidder, 0.908 * price AS price, `dateTime`, extra FROM bid",
          spark=_spark_q1),
    Query("q2", "selection", ("auction", "price"),
          oracle="SELECT auction, price FROM bid WHERE auction % 123 = 0",
          lakefold=(LakefoldView("q2", _BID, ("position",),
                                 "SELECT position, auction, price FROM bid "
                                 "WHERE auction % 123 = 0"),),
          flink="SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0", spark=_spark_q2),
    Query("q3", "local item suggestion (incremental join)", ("name", "city", "state", "id"),
          oracle="SELECT P.name, P.city, P.state, A.id FROM auction A JOIN person P "
                 "ON A.seller = P.id WHERE A.category = 10 AND P.state IN ('OR', 'ID', 'CA')",
          lakefold=(LakefoldView(
              "q3", {"a": "auction", "p": "person"}, ("a_position", "p_position"),
              "SELECT a.position AS a_position, p.position AS p_position, p.name, p.city, "
              "p.state, a.id FROM a JOIN p ON a.seller = p.id "
              "WHERE a.categoryId = 10 AND p.state IN ('OR', 'ID', 'CA')"),),
          flink="SELECT P.name, P.city, P.state, A.id FROM auction AS A INNER JOIN person AS "
                "P ON A.seller = P.id WHERE A.category = 10 AND (P.state = 'OR' OR "
                "P.state = 'ID' OR P.state = 'CA')",
          spark=_spark_q3),
    Query("q4", "average closing price per category (join, max, average of the maxima)",
          ("category", "avg_final"),
          oracle="""SELECT category, avg(CAST(final AS DOUBLE)) AS avg_final FROM (
                      SELECT max(B.price) AS final, A.category FROM auction A, bid B
                      WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires
                      GROUP BY A.id, A.category) Q GROUP BY category""",
          lakefold=(
              LakefoldView("q4_final", {"a": "auction", "b": "bid"}, ("id",),
                           "SELECT a.id, a.categoryId AS category, max(b.price) AS final "
                           "FROM a JOIN b ON a.id = b.auction "
                           "WHERE b.dateTime BETWEEN a.dateTime AND a.expires "
                           "GROUP BY a.id, a.categoryId"),
              LakefoldView("q4", {"q": "q4_final"}, ("category",),
                           "SELECT category, avg(CAST(final AS DOUBLE)) AS avg_final "
                           "FROM q GROUP BY category")),
          lakefold_native=(LakefoldView(
              "q4_native", {"a": "auction", "b": "bid"}, ("category",),
              "SELECT category, avg(CAST(final AS DOUBLE)) AS avg_final FROM ("
              "SELECT max(b.price) AS final, a.categoryId AS category FROM a JOIN b "
              "ON a.id = b.auction WHERE b.dateTime BETWEEN a.dateTime AND a.expires "
              "GROUP BY a.id, a.categoryId) q GROUP BY category"),),
          flink="""SELECT Q.category, AVG(CAST(Q.final AS DOUBLE)) AS avg_final FROM (
                     SELECT MAX(B.price) AS final, A.category FROM auction A, bid B
                     WHERE A.id = B.auction AND B.`dateTime` BETWEEN A.`dateTime` AND A.expires
                     GROUP BY A.id, A.category) Q GROUP BY Q.category""",
          spark_note=_NO_RETRACTIONS.format(what="an aggregate over a join's aggregate")),
    Query("q5", "hot items (hopping window of 10 s every 2 s)",
          ("auction", "num", "starttime"),
          oracle="""WITH counts AS (SELECT auction, count(*) AS num, starttime
                      FROM bid_hops GROUP BY auction, starttime)
                    SELECT c.auction, c.num, c.starttime FROM counts c JOIN (
                      SELECT starttime, max(num) AS maxn FROM counts GROUP BY starttime) m
                    ON c.starttime = m.starttime AND c.num >= m.maxn""",
          lakefold=(
              LakefoldView("q5_counts", _BID, ("window_start", "auction"),
                           "SELECT auction, count(*) AS num, window_start, window_end FROM bid "
                           "GROUP BY auction, window_start, window_end",
                           window=("hopping", "bid.dateTime", 10, 2)),
              LakefoldView("q5_max", {"c": "q5_counts"}, ("window_start",),
                           "SELECT window_start, max(num) AS maxn FROM c "
                           "GROUP BY window_start"),
              LakefoldView("q5", {"c": "q5_counts", "m": "q5_max"},
                           ("starttime", "auction"),
                           "SELECT c.auction, c.num, c.window_start AS starttime FROM c "
                           "JOIN m ON c.window_start = m.window_start AND c.num >= m.maxn")),
          lakefold_native=(LakefoldView(
              "q5_native", _BID, ("window_start", "auction"),
              "WITH counts AS (SELECT auction, count(*) AS num, window_start FROM bid "
              "GROUP BY auction, window_start) SELECT c.auction, c.num, c.window_start "
              "FROM counts c JOIN (SELECT window_start, max(num) AS maxn "
              "FROM counts GROUP BY window_start) m ON c.window_start = m.window_start "
              "AND c.num >= m.maxn", window=("hopping", "bid.dateTime", 10, 2),
              columns=("auction", "num", "window_start")),),
          flink="""SELECT AuctionBids.auction, AuctionBids.num, AuctionBids.starttime FROM (
                     SELECT auction, count(*) AS num, window_start AS starttime,
                       window_end AS endtime
                     FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND,
                                    INTERVAL '10' SECOND))
                     GROUP BY auction, window_start, window_end) AS AuctionBids
                   JOIN (
                     SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime
                     FROM (SELECT count(*) AS num, window_start AS starttime,
                             window_end AS endtime
                           FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`),
                                          INTERVAL '2' SECOND, INTERVAL '10' SECOND))
                           GROUP BY auction, window_start, window_end) AS CountBids
                     GROUP BY CountBids.starttime, CountBids.endtime) AS MaxBids
                   ON AuctionBids.starttime = MaxBids.starttime
                     AND AuctionBids.endtime = MaxBids.endtime
                     AND AuctionBids.num >= MaxBids.maxn""",
          spark_note=_NO_RETRACTIONS.format(
              what="a join of a windowed count with the maximum of those counts")),
    Query("q7", "highest bid per tumbling window of 10 s",
          ("auction", "price", "bidder", "dateTime", "extra"),
          oracle="""SELECT B.auction, B.price, B.bidder, B.dateTime, B.extra FROM bid B JOIN (
                      SELECT max(price) AS maxprice, window_end AS end_time FROM bid_tumbles
                      GROUP BY window_start, window_end) B1
                    ON B.price = B1.maxprice
                    WHERE B.dateTime BETWEEN B1.end_time - INTERVAL 10 SECOND AND B1.end_time""",
          lakefold=(
              LakefoldView("q7_max", _BID, ("window_start",),
                           "SELECT window_start, window_end, max(price) AS maxprice FROM bid "
                           "GROUP BY window_start, window_end",
                           window=("tumbling", "bid.dateTime", 10)),
              LakefoldView("q7", {"b": "bid", "m": "q7_max"}, ("position", "window_start"),
                           "SELECT b.position, m.window_start, b.auction, b.price, b.bidder, "
                           "b.dateTime, b.extra FROM b JOIN m ON b.price = m.maxprice "
                           "WHERE b.dateTime BETWEEN m.window_end - INTERVAL 10 SECONDS "
                           "AND m.window_end")),
          lakefold_native=(LakefoldView(
              "q7_native", {"b": "bid", "w": "bid"}, ("position", "window_start", "window_end"),
              "SELECT b.position, m.window_start, m.window_end, b.auction, b.price, b.bidder, "
              "b.dateTime, b.extra FROM b JOIN (SELECT max(price) AS maxprice, window_start, "
              "window_end FROM w GROUP BY window_start, window_end) m ON b.price = m.maxprice "
              "WHERE b.dateTime BETWEEN m.window_end - INTERVAL 10 SECONDS AND m.window_end",
              window=("tumbling", "w.dateTime", 10)),),
          flink="""SELECT B.auction, B.price, B.bidder, B.`dateTime`, B.extra FROM bid B JOIN (
                     SELECT MAX(price) AS maxprice, window_end AS `dateTime`
                     FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
                     GROUP BY window_start, window_end) B1
                   ON B.price = B1.maxprice
                   WHERE B.`dateTime` BETWEEN B1.`dateTime` - INTERVAL '10' SECOND
                     AND B1.`dateTime`""",
          spark_note=_NO_RETRACTIONS.format(what="a join of bids with a windowed maximum")),
    Query("q8", "new users (persons and sellers in the same tumbling window of 10 s)",
          ("id", "name", "starttime"),
          oracle="""SELECT P.id, P.name, P.starttime FROM (
                      SELECT id, name, window_start AS starttime FROM person_tumbles
                      GROUP BY id, name, window_start) P
                    JOIN (SELECT seller, window_start AS starttime FROM auction_tumbles
                          GROUP BY seller, window_start) A
                    ON P.id = A.seller AND P.starttime = A.starttime""",
          lakefold=(
              LakefoldView("q8_persons", {"p": "person"},
                           ("window_start", "window_end", "id", "name"),
                           "SELECT id, name, window_start, window_end FROM p "
                           "GROUP BY id, name, window_start, window_end",
                           window=("tumbling", "p.dateTime", 10)),
              LakefoldView("q8_sellers", {"a": "auction"},
                           ("window_start", "window_end", "seller"),
                           "SELECT seller, window_start, window_end FROM a "
                           "GROUP BY seller, window_start, window_end",
                           window=("tumbling", "a.dateTime", 10)),
              LakefoldView("q8", {"p": "q8_persons", "a": "q8_sellers"},
                           ("starttime", "endtime", "id", "name"),
                           "SELECT p.id, p.name, p.window_start AS starttime, "
                           "p.window_end AS endtime FROM p JOIN a ON p.id = a.seller "
                           "AND p.window_start = a.window_start "
                           "AND p.window_end = a.window_end")),
          flink="""SELECT P.id, P.name, P.starttime FROM (
                     SELECT id, name, window_start AS starttime, window_end AS endtime
                     FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(`dateTime`),
                                       INTERVAL '10' SECOND))
                     GROUP BY id, name, window_start, window_end) P
                   JOIN (
                     SELECT seller, window_start AS starttime, window_end AS endtime
                     FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(`dateTime`),
                                       INTERVAL '10' SECOND))
                     GROUP BY seller, window_start, window_end) A
                   ON P.id = A.seller AND P.starttime = A.starttime
                     AND P.endtime = A.endtime""",
          spark_note=_NO_RETRACTIONS.format(what="a join of two windowed aggregates")),
    Query("q10", "log to a file system (pass-through with the day and minute)",
          ("auction", "bidder", "price", "dateTime", "extra", "dt", "hm"),
          oracle=f"SELECT {_bid_columns()}, {_DUCK_DAY} AS dt, {_DUCK_MINUTE} AS hm FROM bid",
          lakefold=(LakefoldView("q10", _BID, ("position",),
                                 f"SELECT position, {_bid_columns()}, {_SPARK_DAY} AS dt, "
                                 f"{_SPARK_MINUTE} AS hm FROM bid"),),
          flink=f"SELECT {_bid_columns(quote='`')}, {_FLINK_DAY} AS dt, {_FLINK_MINUTE} AS hm "
                "FROM bid",
          spark=_spark_q10),
    Query("q11", "user sessions (session windows of 10 s per bidder)",
          ("bidder", "bid_count", "starttime", "endtime"),
          oracle="""SELECT bidder, count(*) AS bid_count, min(dateTime) AS starttime,
                      max(dateTime) + INTERVAL 10 SECOND AS endtime
                    FROM bid_sessions GROUP BY bidder, session""",
          lakefold=(LakefoldView(
              "q11", _BID, ("window_start", "bidder"),
              "SELECT bidder, count(*) AS bid_count, window_start, window_end FROM bid "
              "GROUP BY bidder, window_start, window_end",
              window=("session", "bid.dateTime", 10, "bidder"),
              columns=("bidder", "bid_count", "window_start", "window_end")),),
          flink="""SELECT B.bidder, count(*) AS bid_count,
                     SESSION_START(B.`dateTime`, INTERVAL '10' SECOND) AS starttime,
                     SESSION_END(B.`dateTime`, INTERVAL '10' SECOND) AS endtime
                   FROM bid B GROUP BY B.bidder, SESSION(B.`dateTime`, INTERVAL '10' SECOND)""",
          spark=_spark_q11, spark_closed_by="endtime"),
    Query("q14", "calculation (a filter, a CASE, a character count)",
          ("auction", "bidder", "price", "bidTimeType", "dateTime", "extra", "c_counts"),
          oracle=f"SELECT auction, bidder, 0.908 * price AS price, {_Q14_TYPE} AS bidTimeType, "
                 "dateTime, extra, length(extra) - length(replace(extra, 'c', '')) AS c_counts "
                 f"FROM bid WHERE {_Q14_WHERE}",
          lakefold=(LakefoldView(
              "q14", _BID, ("position",),
              f"SELECT position, auction, bidder, 0.908 * price AS price, {_Q14_TYPE} AS "
              "bidTimeType, dateTime, extra, length(extra) - length(replace(extra, 'c', '')) "
              f"AS c_counts FROM bid WHERE {_Q14_WHERE}"),),
          flink="SELECT auction, bidder, 0.908 * price AS price, "
                + _Q14_TYPE.replace("hour(dateTime)", "HOUR(`dateTime`)")
                + " AS bidTimeType, `dateTime`, extra, CHAR_LENGTH(extra) - "
                "CHAR_LENGTH(REPLACE(extra, 'c', '')) AS c_counts FROM bid WHERE " + _Q14_WHERE,
          spark=_spark_q14),
    Query("q15", "bidding statistics per day (count and distinct counts with filters)",
          ("day", "total_bids", "rank1_bids", "rank2_bids", "rank3_bids", "total_bidders",
           "rank1_bidders", "rank2_bidders", "rank3_bidders", "total_auctions",
           "rank1_auctions", "rank2_auctions", "rank3_auctions"),
          oracle=_Q15_SELECT.format(day=_DUCK_DAY),
          lakefold=(LakefoldView(
              "q15", _BID, ("window_start",),
              _Q15_SELECT.format(day=_SPARK_DAY).replace(
                  f"GROUP BY {_SPARK_DAY}", "GROUP BY window_start, window_end").replace(
                  f"SELECT {_SPARK_DAY} AS day", "SELECT window_start, "
                  "date_format(window_start, 'yyyy-MM-dd') AS day"),
              window=("tumbling", "bid.dateTime", 86_400)),),
          lakefold_native=(LakefoldView("q15_native", _BID, ("day",),
                                        _Q15_SELECT.format(day=_SPARK_DAY)),),
          lakefold_note="GROUP BY day has no input column in its key: written over tumbling "
                        "windows of one day",
          flink=_flink_names(_Q15_SELECT.format(day=_FLINK_DAY)),
          spark_note="distinct aggregations are not supported on streaming DataFrames"),
    Query("q16", "channel statistics per day",
          ("channel", "day", "minute", "total_bids", "rank1_bids", "rank2_bids", "rank3_bids",
           "total_bidders", "rank1_bidders", "rank2_bidders", "rank3_bidders",
           "total_auctions", "rank1_auctions", "rank2_auctions", "rank3_auctions"),
          oracle=_Q16_SELECT.format(day=_DUCK_DAY, minute=_DUCK_MINUTE),
          lakefold=(LakefoldView("q16", _BID, ("channel", "day"),
                                 _Q16_SELECT.format(day=_SPARK_DAY, minute=_SPARK_MINUTE)),),
          flink=_flink_names(_Q16_SELECT.format(day=_FLINK_DAY, minute=_FLINK_MINUTE)),
          spark_note="distinct aggregations are not supported on streaming DataFrames"),
    Query("q17", "auction statistics per day",
          ("auction", "day", "total_bids", "rank1_bids", "rank2_bids", "rank3_bids",
           "min_price", "max_price", "avg_price", "sum_price"),
          oracle=_Q17_SELECT.format(day=_DUCK_DAY),
          lakefold=(LakefoldView("q17", _BID, ("auction", "day"),
                                 _Q17_SELECT.format(day=_SPARK_DAY)),),
          flink=_flink_names(_Q17_SELECT.format(day=_FLINK_DAY)), spark=_spark_q17,
          spark_keys=("auction", "day")),
    Query("q18", "last bid per bidder and auction (deduplication)",
          ("auction", "bidder", "price", "channel", "url", "dateTime", "extra"),
          oracle="""SELECT auction, bidder, price, channel, url, dateTime, extra FROM (
                      SELECT *, row_number() OVER (PARTITION BY bidder, auction
                        ORDER BY dateTime DESC, position DESC) AS rank_number FROM bid)
                    WHERE rank_number <= 1""",
          lakefold=(
              LakefoldView("q18_last", _BID, ("bidder", "auction"),
                           "SELECT bidder, auction, max(struct(dateTime, position)).position "
                           "AS last FROM bid GROUP BY bidder, auction"),
              LakefoldView("q18", {"b": "bid", "l": "q18_last"},
                           ("position", "last_bidder", "last_auction"),
                           "SELECT b.position, l.bidder AS last_bidder, "
                           "l.auction AS last_auction, b.auction, b.bidder, b.price, "
                           "b.channel, b.url, b.dateTime, b.extra "
                           "FROM b JOIN l ON b.position = l.last")),
          lakefold_native=(LakefoldView(
              "q18_native", _BID, ("position",),
              "SELECT position, auction, bidder, price, channel, url, dateTime, extra FROM ("
              "SELECT *, row_number() OVER (PARTITION BY bidder, auction "
              "ORDER BY dateTime DESC, position DESC) AS rank_number FROM bid) "
              "WHERE rank_number <= 1"),),
          lakefold_note="ROW_NUMBER() is refused (window functions); written as a chain: the "
                        "last (dateTime, position) per bidder and auction, joined back",
          flink="""SELECT auction, bidder, price, channel, url, `dateTime`, extra FROM (
                     SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction
                       ORDER BY `dateTime` DESC, `position` DESC) AS rank_number FROM bid)
                   WHERE rank_number <= 1""",
          spark_note="window functions (ROW_NUMBER) are not supported on streaming DataFrames"),
    Query("q19", "top 10 bids per auction by price",
          ("auction", "bidder", "price", "channel", "url", "dateTime", "extra", "rank_number"),
          oracle="""SELECT auction, bidder, price, channel, url, dateTime, extra, rank_number
                    FROM (SELECT *, row_number() OVER (PARTITION BY auction
                            ORDER BY price DESC, position ASC) AS rank_number FROM bid)
                    WHERE rank_number <= 10""",
          lakefold_native=(LakefoldView(
              "q19_native", _BID, ("auction", "rank_number"),
              "SELECT auction, bidder, price, channel, url, dateTime, extra, rank_number FROM ("
              "SELECT *, row_number() OVER (PARTITION BY auction ORDER BY price DESC, "
              "position ASC) AS rank_number FROM bid) WHERE rank_number <= 10"),),
          lakefold=(LakefoldView(
              "q19", {"b": "bid", "h": "bid"}, ("position",),
              "SELECT b.position, b.auction, b.bidder, b.price, b.channel, b.url, b.dateTime, "
              "b.extra, count(h.position) + 1 AS rank_number FROM b LEFT JOIN h "
              "ON h.auction = b.auction AND (h.price > b.price OR (h.price = b.price "
              "AND h.position < b.position)) GROUP BY b.position, b.auction, b.bidder, "
              "b.price, b.channel, b.url, b.dateTime, b.extra HAVING count(h.position) < 10"),),
          lakefold_note="ROW_NUMBER() is refused (window functions); written as a self-join "
                        "of bids: a bid's rank is one more than the bids of its auction above "
                        "it (price, then position), kept while below 10",
          flink="""SELECT auction, bidder, price, channel, url, `dateTime`, extra, rank_number
                   FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction
                           ORDER BY price DESC, `position` ASC) AS rank_number FROM bid)
                   WHERE rank_number <= 10""",
          spark_note="window functions (ROW_NUMBER) are not supported on streaming DataFrames"),
    Query("q20", "bids expanded with their auction (join)",
          ("auction", "bidder", "price", "channel", "url", "bid_dateTime", "bid_extra",
           "itemName", "description", "initialBid", "reserve", "auction_dateTime", "expires",
           "seller", "category", "auction_extra"),
          oracle="""SELECT auction, bidder, price, channel, url, B.dateTime AS bid_dateTime,
                      B.extra AS bid_extra, itemName, description, initialBid, reserve,
                      A.dateTime AS auction_dateTime, expires, seller, category,
                      A.extra AS auction_extra
                    FROM bid AS B INNER JOIN auction AS A ON B.auction = A.id
                    WHERE A.category = 10""",
          lakefold=(LakefoldView(
              "q20", {"b": "bid", "a": "auction"}, ("position", "a_position"),
              "SELECT b.position, a.position AS a_position, b.auction, b.bidder, b.price, "
              "b.channel, b.url, b.dateTime AS bid_dateTime, b.extra AS bid_extra, a.itemName, "
              "a.description, a.initialBid, a.reserve, a.dateTime AS auction_dateTime, "
              "a.expires, a.seller, a.categoryId AS category, a.extra AS auction_extra "
              "FROM b JOIN a ON b.auction = a.id WHERE a.categoryId = 10"),),
          flink="""SELECT auction, bidder, price, channel, url, B.`dateTime` AS bid_dateTime,
                     B.extra AS bid_extra, itemName, description, initialBid, reserve,
                     A.`dateTime` AS auction_dateTime, expires, seller, category,
                     A.extra AS auction_extra
                   FROM bid AS B INNER JOIN auction AS A ON B.auction = A.id
                   WHERE A.category = 10""",
          spark=_spark_q20),
    Query("q21", "add a channel id (regular expressions)",
          ("auction", "bidder", "price", "channel", "channel_id"),
          oracle="SELECT auction, bidder, price, channel, "
                 + _Q21_NAMED.format(extract=_DUCK_EXTRACT) + " AS channel_id FROM bid WHERE "
                 + _Q21_WHERE.format(extract=_DUCK_EXTRACT),
          lakefold=(LakefoldView(
              "q21", _BID, ("position",),
              "SELECT position, auction, bidder, price, channel, "
              + _Q21_NAMED.format(extract=_SPARK_EXTRACT) + " AS channel_id FROM bid WHERE "
              + _Q21_WHERE.format(extract=_SPARK_EXTRACT)),),
          flink="SELECT auction, bidder, price, channel, "
                + _Q21_NAMED.format(extract=_FLINK_EXTRACT) + " AS channel_id FROM bid WHERE "
                + _Q21_WHERE.format(extract=_FLINK_EXTRACT),
          spark=_spark_q21),
    Query("q22", "get URL directories (string splits)",
          ("auction", "bidder", "price", "channel", "dir1", "dir2", "dir3"),
          oracle="SELECT auction, bidder, price, channel, split_part(url, '/', 4) AS dir1, "
                 "split_part(url, '/', 5) AS dir2, split_part(url, '/', 6) AS dir3 FROM bid",
          lakefold=(LakefoldView(
              "q22", _BID, ("position",),
              "SELECT position, auction, bidder, price, channel, split(url, '/')[3] AS dir1, "
              "split(url, '/')[4] AS dir2, split(url, '/')[5] AS dir3 FROM bid"),),
          flink="SELECT auction, bidder, price, channel, SPLIT_INDEX(url, '/', 3) AS dir1, "
                "SPLIT_INDEX(url, '/', 4) AS dir2, SPLIT_INDEX(url, '/', 5) AS dir3 FROM bid",
          spark=_spark_q22),
)

#: Queries no engine runs here, and why (they depend on the wall clock or on a window function
#: lakefold refuses, with no rewrite).
NOT_RUN: dict[str, str] = {
    "q6": "average selling price per seller over its last 10 closed auctions: AVG(...) OVER "
          "(PARTITION BY seller ORDER BY dateTime ROWS BETWEEN 10 PRECEDING AND CURRENT ROW) "
          "over a ROW_NUMBER() top-1: window functions, refused by lakefold's views ("
          "not run by Nexmark's own Flink suite either: FLINK-19059)",
    "q9": "winning bids (ROW_NUMBER() per auction over a join): a window function, refused "
          "by lakefold's views; its rewrite is q4's first view plus a join back, as q18's",
    "q12": "processing-time windows: results depend on the wall clock, so no oracle; lakefold's "
           "windows are over event time only (a deliberate limit, README § Windows)",
    "q13": "a join with a side-input file by processing time: results depend on the wall "
           "clock; lakefold's equivalent is lookup(..., as_of='latest') over a captured table",
}

BY_NAME = {q.name: q for q in QUERIES}
