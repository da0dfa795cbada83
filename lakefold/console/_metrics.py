"""``/metrics``: the monitor's latest reading in the Prometheus exposition format, every name
prefixed ``lakefold_`` (the names and their labels are listed in README.md, "Console").

A custom collector turns the reading into metric families at each scrape, so a scrape costs
no store query (the monitor reads once per interval, whatever the number of scrapers).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CollectorRegistry, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from lakefold.console._monitor import Monitor

#: (name, help, labels) of every metric; README.md documents the same list.
METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "lakefold_console_store_up": ("1 when the console's last reading of the store worked.", ()),
    "lakefold_console_reading_seconds": ("How long the last reading of the store took.", ()),
    "lakefold_projection_lag_records": (
        "Records not yet processed, per projection (or view) and source.",
        ("projection", "source")),
    "lakefold_projection_lag_seconds": (
        "Age of the oldest record not yet processed, per projection.", ("projection",)),
    "lakefold_projection_throughput_records_per_second": (
        "Records processed per second over the last minute, per projection.", ("projection",)),
    "lakefold_projection_generation": ("The live generation, per projection.", ("projection",)),
    "lakefold_projection_failed": (
        "1 when the projection failed (its last error needs a person).", ("projection",)),
    "lakefold_projection_errors": (
        "1 when the projection has a last error (failed or retrying).", ("projection",)),
    "lakefold_projection_paused": ("1 when the projection is paused.", ("projection",)),
    "lakefold_projection_dead_letters": (
        "Open dead letters (open or queued for retry), per projection.", ("projection",)),
    "lakefold_capture_lag_bytes": (
        "WAL bytes between the server's position and the slot's confirmed LSN.", ("slot",)),
    "lakefold_capture_lag_seconds": ("Seconds the capture is behind the source.", ("slot",)),
    "lakefold_capture_wal_retained_bytes": (
        "WAL the slot makes the source server keep.", ("slot",)),
    "lakefold_capture_safe_wal_size_bytes": (
        "WAL that may still be written before the slot is lost (absent when unlimited).",
        ("slot",)),
    "lakefold_capture_changes_per_second": ("Changes stored per second.", ("slot",)),
    "lakefold_capture_healthy": ("1 when the slot's health is ok.", ("slot",)),
    "lakefold_eventstore_head_position": ("The last visible global position.", ()),
    "lakefold_eventstore_events_per_second": ("Events made visible per second.", ()),
    "lakefold_eventstore_pending_events": (
        "Events committed but not yet visible (behind the watermark).", ()),
    "lakefold_eventstore_watermark_age_seconds": (
        "How long the transaction holding the visibility watermark has been open (0: none).",
        ()),
    "lakefold_subscription_lag_events": (
        "Events after a durable subscription's checkpoint.", ("subscription",)),
}


class _ReadingCollector(Collector):
    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        families = {name: GaugeMetricFamily(name, text, labels=list(labels))
                    for name, (text, labels) in METRICS.items()}
        reading = self.monitor.reading
        families["lakefold_console_store_up"].add_metric([], 0 if reading.overview is None else 1)
        families["lakefold_console_reading_seconds"].add_metric([], reading.seconds)
        overview = reading.overview
        if overview is not None:
            self._projections(families, overview["projections"])
            self._captures(families, overview["captures"])
            store = overview["event_store"]
            families["lakefold_eventstore_head_position"].add_metric([], store["head"])
            families["lakefold_eventstore_events_per_second"].add_metric(
                [], store["events_per_s"])
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
    def _projections(families: dict[str, GaugeMetricFamily], entries: list[dict[str, Any]]
                     ) -> None:
        for p in entries:
            name = p["name"]
            for source in p["sources"]:
                families["lakefold_projection_lag_records"].add_metric(
                    [name, source["source"]], source["lag_records"])
            families["lakefold_projection_lag_seconds"].add_metric([name], p["lag_seconds"])
            families["lakefold_projection_throughput_records_per_second"].add_metric(
                [name], p["throughput_per_s"])
            families["lakefold_projection_generation"].add_metric([name], p["generation"])
            families["lakefold_projection_failed"].add_metric([name], int(p["state"] == "failed"))
            families["lakefold_projection_errors"].add_metric([name], int(bool(p["last_error"])))
            families["lakefold_projection_paused"].add_metric([name], int(p["paused"]))
            families["lakefold_projection_dead_letters"].add_metric([name], p["dead_letters"])

    @staticmethod
    def _captures(families: dict[str, GaugeMetricFamily], captures: list[dict[str, Any]]
                  ) -> None:
        for c in captures:
            slot = [c["slot"]]
            for metric, field in (("lakefold_capture_lag_bytes", "lag_bytes"),
                                  ("lakefold_capture_lag_seconds", "lag_seconds"),
                                  ("lakefold_capture_wal_retained_bytes", "retained_bytes"),
                                  ("lakefold_capture_safe_wal_size_bytes", "safe_wal_size")):
                if c[field] is not None:
                    families[metric].add_metric(slot, c[field])
            families["lakefold_capture_changes_per_second"].add_metric(slot, c["changes_per_s"])
            families["lakefold_capture_healthy"].add_metric(slot, int(c["status"] == "ok"))


def metrics_registry(monitor: Monitor) -> CollectorRegistry:
    """A registry of its own (not the process-wide one) that reads ``monitor``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ReadingCollector(monitor))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in the Prometheus text format."""
    return generate_latest(registry)
