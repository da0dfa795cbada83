"""``/metrics``: the monitor's latest reading in the Prometheus exposition format, every name
prefixed ``lakefold_`` and ending in its unit (the names and their labels are listed in
README.md, "Console"; infra/ has a Grafana dashboard and alert rules over them).

What counts is a counter (``*_total``), so that ``rate()`` gives records, changes, events,
errors and dead letters per second; a state is a gauge per state (1 for the one it is in);
labels name things that stay (a projection, its input by alias, a slot), never a generation.

A custom collector turns the reading into metric families at each scrape, so a scrape costs
no store query (the monitor reads once per interval, whatever the number of scrapers).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from lakefold.console._monitor import Monitor

#: The states a projection (or view) is in, each a series of ``lakefold_projection_state``.
PROJECTION_STATES = ("idle", "running", "rebuilding", "paused", "resuming", "stopped",
                     "retrying", "failed")
#: The statuses of a capture's slot, each a series of ``lakefold_capture_status``.
CAPTURE_STATUSES = ("ok", "warning", "critical", "lost", "missing")

#: name -> (kind, help, labels) of every metric; README.md documents the same list. A
#: counter's name is given with its ``_total``, as it is exposed and queried.
METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "lakefold_console_store_up": (
        "gauge", "1 when the console's last reading of the store worked.", ()),
    "lakefold_console_reading_seconds": (
        "gauge", "How long the last reading of the store took.", ()),
    "lakefold_projection_records_total": (
        "counter", "Records processed: the positions applied, summed over the projection's "
                   "inputs (the scale of lag_records).", ("projection",)),
    "lakefold_projection_errors_total": (
        "counter", "Errors the projection ran into, counted by its runner in the catalog (each "
                   "time it went retrying or failed with an error).", ("projection",)),
    "lakefold_projection_dead_letters_total": (
        "counter", "Dead letters ever recorded for the projection.", ("projection",)),
    "lakefold_projection_dead_letters_open": (
        "gauge", "Dead letters waiting for a person (open or queued for retry).",
        ("projection",)),
    "lakefold_projection_lag_records": (
        "gauge", "Records not yet processed, per projection (or view) and input.",
        ("projection", "input")),
    "lakefold_projection_lag_seconds": (
        "gauge", "Age of the oldest record not yet processed.", ("projection",)),
    "lakefold_projection_state": (
        "gauge", "1 for the state the projection is in (idle, running, rebuilding, paused, "
                 "resuming, stopped, retrying, failed), 0 for the others.",
        ("projection", "state")),
    "lakefold_projection_generation": (
        "gauge", "The live generation.", ("projection",)),
    "lakefold_capture_changes_total": (
        "counter", "Changes the capture stored.", ("slot",)),
    "lakefold_capture_status": (
        "gauge", "1 for the slot's health (ok, warning, critical, lost, missing), 0 for the "
                 "others.", ("slot", "status")),
    "lakefold_capture_paused": ("gauge", "1 when the capture is paused.", ("slot",)),
    "lakefold_capture_lag_bytes": (
        "gauge", "WAL between the server's position and the slot's confirmed LSN.", ("slot",)),
    "lakefold_capture_lag_seconds": (
        "gauge", "Seconds the capture is behind the source.", ("slot",)),
    "lakefold_capture_wal_retained_bytes": (
        "gauge", "WAL the slot makes the source server keep.", ("slot",)),
    "lakefold_capture_safe_wal_size_bytes": (
        "gauge", "WAL that may still be written before the slot is lost (absent when "
                 "unlimited).", ("slot",)),
    "lakefold_eventstore_events_total": (
        "counter", "Events made visible (the event store's head position).", ()),
    "lakefold_eventstore_pending_events": (
        "gauge", "Events committed but not yet visible (behind the watermark).", ()),
    "lakefold_eventstore_watermark_age_seconds": (
        "gauge", "How long the transaction holding the visibility watermark has been open "
                 "(0: none).", ()),
    "lakefold_subscription_lag_events": (
        "gauge", "Events after a durable subscription's checkpoint.", ("subscription",)),
}

Families = dict[str, GaugeMetricFamily | CounterMetricFamily]


def _families() -> Families:
    families: Families = {}
    for name, (kind, text, labels) in METRICS.items():
        if kind == "counter":  # prometheus_client adds the _total itself
            families[name] = CounterMetricFamily(name.removesuffix("_total"), text,
                                                 labels=list(labels))
        else:
            families[name] = GaugeMetricFamily(name, text, labels=list(labels))
    return families


def input_label(source: str) -> str:
    """A status's source as a label that stays across rebuilds: its alias (a view's input
    is shown as ``alias (stream)``, the stream naming the generation it reads)."""
    return source.split(" (", 1)[0]


class _ReadingCollector(Collector):
    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        families = _families()
        reading = self.monitor.reading
        families["lakefold_console_store_up"].add_metric([], 0 if reading.overview is None else 1)
        families["lakefold_console_reading_seconds"].add_metric([], reading.seconds)
        overview = reading.overview
        if overview is not None:
            self._projections(families, overview["projections"])
            self._captures(families, overview["captures"])
            store = overview["event_store"]
            families["lakefold_eventstore_events_total"].add_metric([], store["head"])
            families["lakefold_eventstore_pending_events"].add_metric(
                [], store["pending_events"])
            holder = store["watermark_holder"]
            families["lakefold_eventstore_watermark_age_seconds"].add_metric(
                [], float(holder["held_for_s"]) if holder else 0.0)
            for sub in store["subscriptions"]:
                families["lakefold_subscription_lag_events"].add_metric([sub["name"]],
                                                                        sub["lag"])
        yield from families.values()

    @staticmethod
    def _projections(families: Families, entries: list[dict[str, Any]]) -> None:
        for p in entries:
            name = p["name"]
            lags: dict[str, int] = {}
            for source in p["sources"]:
                label = input_label(source["source"])
                lags[label] = lags.get(label, 0) + int(source["lag_records"])
            for label, lag in lags.items():
                families["lakefold_projection_lag_records"].add_metric([name, label], lag)
            families["lakefold_projection_records_total"].add_metric([name], p["records_total"])
            families["lakefold_projection_errors_total"].add_metric([name], p["errors_total"])
            families["lakefold_projection_dead_letters_total"].add_metric(
                [name], p["dead_letters_total"])
            families["lakefold_projection_dead_letters_open"].add_metric([name],
                                                                        p["dead_letters"])
            families["lakefold_projection_lag_seconds"].add_metric([name], p["lag_seconds"])
            families["lakefold_projection_generation"].add_metric([name], p["generation"])
            states = (*PROJECTION_STATES, *([p["state"]] if p["state"] not in
                                            PROJECTION_STATES else []))
            for state in states:
                families["lakefold_projection_state"].add_metric(
                    [name, state], int(p["state"] == state))

    @staticmethod
    def _captures(families: Families, captures: list[dict[str, Any]]) -> None:
        for c in captures:
            slot = [c["slot"]]
            for metric, field in (("lakefold_capture_lag_bytes", "lag_bytes"),
                                  ("lakefold_capture_lag_seconds", "lag_seconds"),
                                  ("lakefold_capture_wal_retained_bytes", "retained_bytes"),
                                  ("lakefold_capture_safe_wal_size_bytes", "safe_wal_size")):
                if c[field] is not None:
                    families[metric].add_metric(slot, c[field])
            families["lakefold_capture_changes_total"].add_metric(slot, c["records"])
            families["lakefold_capture_paused"].add_metric(slot, int(c["paused"]))
            for status in CAPTURE_STATUSES:
                families["lakefold_capture_status"].add_metric(
                    [c["slot"], status], int(c["status"] == status))


def metrics_registry(monitor: Monitor) -> CollectorRegistry:
    """A registry of its own (not the process-wide one) that reads ``monitor``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ReadingCollector(monitor))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in the Prometheus text format."""
    return generate_latest(registry)
