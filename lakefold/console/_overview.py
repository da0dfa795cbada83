"""The overview: one JSON-ready picture of the whole system, read from the stores.

Captures (every slot that has changelog streams, with its source; ``slot_health`` of those
of the console's source database), the event store (head,
the transaction holding the visibility watermark, durable subscriptions and their lag),
every projection and view (``projection_status``, what ``lakefold status`` shows) and the
DAG that joins them: sources → projections → views → targets, each node with a health.

Rates (changes/s, events/s) need two readings; the monitor (``_monitor``) fills them in from
the previous overview.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import psycopg

from lakefold.capture import DERIVED_SLOT, CaptureConfig, ChangelogStore, slot_health
from lakefold.eventstore import (
    EventStore,
    EventStoreNotInstalledError,
    StoreOptions,
    list_subscriptions,
)
from lakefold.eventstore.recorder import WatermarkHolder
from lakefold.projections.operations import Catalog, projection_status

#: Projection states that need a person's attention.
FAILED_STATES = frozenset({"failed"})
#: Projection states that are not wrong but not flowing either.
WAITING_STATES = frozenset({"paused", "resuming", "stopped", "retrying", "rebuilding"})


@dataclass(frozen=True)
class StoreAddresses:
    """Where the console reads: lakefold's store, and the source database of the captures
    (None: the store's database)."""

    store_dsn: str
    source_dsn: str | None = None


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _source_identity(dsn: str) -> tuple[str, str]:
    """(system identifier, database) of the console's source."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute("SELECT system_identifier::text, current_database() "
                           "FROM pg_control_system()").fetchone()
    return (str(row[0]), str(row[1])) if row else ("", "")


def read_captures(addresses: StoreAddresses) -> list[dict[str, Any]]:
    """Every capture slot that has streams in the store, with its source and stream prefix;
    the health of those whose source is the console's source database (a capture of another
    source is listed with status ``unknown``: its slot lives on a server the console does not
    connect to, and is not "missing" from this one)."""
    with ChangelogStore(addresses.store_dsn) as store:
        recorded = [c for c in store.captures() if c.streams and c.slot != DERIVED_SLOT]
    source_dsn = addresses.source_dsn or addresses.store_dsn
    here = _source_identity(source_dsn) if recorded else ("", "")
    captures = []
    for capture in recorded:
        entry: dict[str, Any] = {"slot": capture.slot, "source": capture.shown_source,
                                 "stream_prefix": capture.stream_prefix,
                                 "streams": sorted(capture.streams), "changes_per_s": 0.0}
        if (capture.system_id, capture.database) != here:
            captures.append(entry | {
                "status": "unknown", "active": False, "paused": False, "wal_status": None,
                "safe_wal_size": None, "lag_bytes": None, "lag_seconds": None,
                "retained_bytes": None, "records": capture.records, "snapshots": [],
                "last_error": None,
                "problems": [f"its source {capture.shown_source} is not the console's source "
                             "database: read its health there (lakefold capture status "
                             "--dsn ...)"]})
            continue
        config = CaptureConfig(source_dsn=source_dsn, store_dsn=addresses.store_dsn,
                               slot=capture.slot, tables=("public.unused",))
        health = slot_health(config)
        captures.append(entry | {
            "status": health.status, "active": health.active,
            "paused": health.paused, "wal_status": health.wal_status,
            "safe_wal_size": health.safe_wal_size, "lag_bytes": health.lag_bytes,
            "lag_seconds": health.lag_seconds, "retained_bytes": health.retained_bytes,
            "records": health.records,
            # the running snapshot runs: tables done of all, rows copied so far
            "snapshots": [dict(s) for s in health.snapshots],
            "last_error": health.last_error, "problems": list(health.problems),
        })
    return captures


def read_event_store(addresses: StoreAddresses) -> dict[str, Any]:
    """The event store's head, watermark holder and subscriptions (each with its lag)."""
    options = StoreOptions(pool_size=1, application_name="lakefold-console")
    try:
        with EventStore(addresses.store_dsn, options=options) as store:
            status = store.status()
    except EventStoreNotInstalledError:  # no events yet: nothing to show
        return {"head": 0, "events_per_s": 0.0, "pending_events": 0, "watermark_held": False,
                "watermark_holder": None, "subscriptions": []}
    subscriptions = [{"name": s.name, "position": s.position,
                      "lag": max(0, status.head - s.position),
                      "updated_at": _iso(s.updated_at)}
                     for s in list_subscriptions(addresses.store_dsn)]
    return {"head": status.head, "events_per_s": 0.0,
            "pending_events": status.pending_events, "watermark_held": status.held,
            "watermark_holder": _holder(status.holder), "subscriptions": subscriptions}


def _holder(holder: WatermarkHolder | None) -> dict[str, Any] | None:
    """Who holds the watermark: pid, application, state and for how long; never the
    statement it runs (another session's SQL may hold card numbers or passwords)."""
    if holder is None:
        return None
    return {"pid": holder.pid, "application": holder.application, "state": holder.state,
            "xact_start": _iso(holder.xact_start),
            "held_for_s": max(0.0, round(holder.held_for_s, 3)),  # read in another snapshot
            "prepared": holder.prepared_gid is not None}


def read_projections(catalog: Catalog, addresses: StoreAddresses) -> list[dict[str, Any]]:
    """Every projection and view as ``lakefold status`` reports it, with its definition's
    inputs and target for the DAG."""
    result = []
    dead_letters = dead_letters_ever(addresses.store_dsn)
    for status in projection_status(catalog, addresses.store_dsn):
        entry = status.as_json()
        # what it processed, on the scale of its lag: the positions applied of its inputs
        entry["records_total"] = sum(int(v) for v in status.position.values())
        entry["dead_letters_total"] = dead_letters.get(status.name, 0)
        definition = catalog.definition(status.name) or {}
        entry["inputs"] = _inputs_of(definition)
        entry["target_spec"] = definition.get("target", {}).get("kind", status.target)
        entry["key"] = definition.get("key")
        entry["health"] = projection_health(entry)
        result.append(entry)
    return result


def dead_letters_ever(store_dsn: str) -> dict[str, int]:
    """Every dead letter ever recorded, per projection (dropped and resolved ones too, so the
    count only grows)."""
    with psycopg.connect(store_dsn, autocommit=True, connect_timeout=10) as conn:
        if conn.execute("SELECT to_regclass('lakefold.projection_dead_letters')").fetchone() \
                == (None,):
            return {}
        rows = conn.execute("SELECT name, count(*) FROM lakefold.projection_dead_letters "
                            "GROUP BY name").fetchall()
    return {str(name): int(count) for name, count in rows}


def _inputs_of(definition: dict[str, Any]) -> list[dict[str, str]]:
    """A definition's inputs as ``{"kind": "changelog"|"events"|"view", "name": ...}``."""
    found = []
    for source in definition.get("sources", []) or []:
        if source.get("kind") == "changelog":
            found.append({"kind": "changelog", "name": str(source["table"])})
        elif source.get("kind") == "events":
            found.append({"kind": "events", "name": str(source.get("category") or "all")})
    for entry in (definition.get("inputs") or {}).values():
        if entry.get("events") is not None:
            found.append({"kind": "events", "name": str(entry["events"]["category"])})
        elif entry.get("table") is not None:
            found.append({"kind": "changelog", "name": str(entry["table"])})
        elif entry.get("view") is not None:
            found.append({"kind": "view", "name": str(entry["view"])})
    return found


def projection_health(entry: dict[str, Any]) -> str:
    """``failed`` (needs a person), ``warning`` (paused, resuming, stopped, retrying,
    rebuilding, dead letters) or ``ok``."""
    if entry["state"] in FAILED_STATES:
        return "failed"
    if entry["state"] in WAITING_STATES or entry["dead_letters"]:
        return "warning"
    return "ok"


def build_dag(captures: list[dict[str, Any]], projections: list[dict[str, Any]]
              ) -> dict[str, Any]:
    """Nodes (id, kind, label, health, column) and edges (from, to): captures and event
    categories → changelog streams → projections → views → targets."""
    nodes: dict[str, dict[str, Any]] = {}
    edges: list[tuple[str, str]] = []

    def node(node_id: str, kind: str, label: str, health: str, column: int) -> None:
        nodes.setdefault(node_id, {"id": node_id, "kind": kind, "label": label,
                                   "health": health, "column": column})

    slot_health_of = {c["slot"]: "ok" if c["status"] in ("ok",) else
                      "failed" if c["status"] in ("critical", "lost", "missing") else "warning"
                      for c in captures}
    for capture in captures:
        node(f"capture:{capture['slot']}", "capture", capture["slot"],
             slot_health_of[capture["slot"]], 0)
        for stream in capture["streams"]:
            node(f"changelog:{stream}", "changelog", stream, slot_health_of[capture["slot"]], 1)
            edges.append((f"capture:{capture['slot']}", f"changelog:{stream}"))
    views = {p["name"] for p in projections if p["style"] == "view"}
    depth: dict[str, int] = {}

    def view_depth(name: str, seen: frozenset[str] = frozenset()) -> int:
        if name in depth:
            return depth[name]
        entry = next((p for p in projections if p["name"] == name), None)
        upstream = [i["name"] for i in (entry or {}).get("inputs", [])
                    if i["kind"] == "view" and i["name"] not in seen]
        depth[name] = 1 + max((view_depth(u, seen | {name}) for u in upstream), default=0)
        return depth[name]

    for entry in projections:
        name = entry["name"]
        column = 1 + view_depth(name) if name in views else 2
        node(f"{entry['style']}:{name}", entry["style"], name, entry["health"], column)
    last = max((n["column"] for n in nodes.values()), default=1) + 1
    for entry in projections:
        name = entry["name"]
        me = f"{entry['style']}:{name}"
        for item in entry["inputs"]:
            if item["kind"] == "view":
                source = f"view:{item['name']}"
            elif item["kind"] == "events":
                source = f"events:{item['name']}"
                node(source, "events", f"events {item['name']}", "ok", 1)
            else:
                source = f"changelog:{item['name']}"
                node(source, "changelog", item["name"], "ok", 1)
            edges.append((source, me))
        target = f"target:{entry['target']}:{name}"
        node(target, "target", f"{entry['target_spec']} {name}", entry["health"], last)
        edges.append((me, target))
    return {"nodes": sorted(nodes.values(), key=lambda n: (n["column"], n["id"])),
            "edges": [{"from": a, "to": b} for a, b in dict.fromkeys(edges)]}


def read_overview(catalog: Catalog, addresses: StoreAddresses) -> dict[str, Any]:
    """The whole picture, read now (rates 0: the monitor computes them between readings)."""
    captures = read_captures(addresses)
    projections = read_projections(catalog, addresses)
    return {
        "read_at": dt.datetime.now(dt.UTC).isoformat(),
        "captures": captures,
        "event_store": read_event_store(addresses),
        "projections": projections,
        "dag": build_dag(captures, projections),
    }
