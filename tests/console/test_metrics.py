"""``/metrics`` of the running system's console as Prometheus reads it: what counts is a counter
that grows with the workload, states are labelled gauges, no label moves with a rebuild; and
infra/'s alert rules and Grafana dashboard are valid PromQL (parsed by promql-parser, the
parser GreptimeDB uses) over metrics this console exposes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from lakefold.console import METRICS
from lakefold.projections.operations import Catalog, SinkRoots
from tests.console.conftest import PROJECTIONS, System, wait_until

pytestmark = pytest.mark.timeout(300)

INFRA = Path(__file__).resolve().parents[2] / "infra"
RULES = INFRA / "prometheus" / "lakefold-alerts.yml"
DASHBOARD = INFRA / "grafana" / "lakefold-dashboard.json"
# Grafana's variables, as Grafana substitutes them before Prometheus sees the query
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$projection": ".*", "$slot": ".*"}


def scrape(system: System) -> dict[str, Any]:
    """name → (type, {labels tuple: value}) of every sample family."""
    with system.client() as client:
        response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    found: dict[str, Any] = {}
    for family in text_string_to_metric_families(response.text):
        # a family without samples (no subscription, an unlimited safe_wal_size) still counts
        name = family.name + ("_total" if family.type == "counter" else "")
        found.setdefault(name, (family.type, {}))
        for sample in family.samples:
            values = found.setdefault(sample.name, (family.type, {}))[1]
            values[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects; a syntax error fails here."""
    names: set[str] = set()

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def test_counters_grow_with_the_workload_and_states_are_labelled(system: System) -> None:
    before = scrape(system)
    assert set(before) == set(METRICS), set(before) ^ set(METRICS)
    for name, (kind, _, _) in METRICS.items():
        assert before[name][0] == kind, name
        assert name.endswith("_total") == (kind == "counter"), name
    records = before["lakefold_projection_records_total"][1]
    assert {dict(k)["projection"] for k in records} >= set(PROJECTIONS)
    changes = before["lakefold_capture_changes_total"][1][(("slot", "console"),)]
    system.write_customers(25)

    def grown() -> dict[str, Any] | None:
        after = scrape(system)
        moved = after["lakefold_capture_changes_total"][1][(("slot", "console"),)] \
            >= changes + 25 and all(
                after["lakefold_projection_records_total"][1][(("projection", name),)]
                >= records[(("projection", name),)] + 25
                for name in ("customer_cache", "customer_cities"))
        return after if moved else None

    after = wait_until(grown, what="the counters to count the new customers")
    states = after["lakefold_projection_state"][1]
    for name in PROJECTIONS:
        mine = {dict(k)["state"]: v for k, v in states.items() if dict(k)["projection"] == name}
        assert sum(mine.values()) == 1 and {"running", "failed", "retrying"} <= set(mine)
    statuses = after["lakefold_capture_status"][1]
    assert statuses[(("slot", "console"), ("status", "ok"))] in (0, 1)
    assert sum(v for k, v in statuses.items() if dict(k)["slot"] == "console") == 1
    dead = after["lakefold_projection_dead_letters_total"][1][(("projection", "revenue"),)]
    assert dead >= 4  # dropped and resolved ones still count
    # no label names a generation (a rebuild would start new series)
    for name, (_, values) in after.items():
        for labels in values:
            assert not any(re.search(r"_g\d+\b", v) for _, v in labels), (name, labels)
    inputs = {dict(k)["input"] for k in after["lakefold_projection_lag_records"][1]
              if dict(k)["projection"] == "city_counts"}
    assert inputs == {"cities"}


def test_errors_total_is_the_count_the_catalog_keeps(system: System) -> None:
    """``errors_total`` (the overview's, and the metric) is counted where the errors happen:
    three retries with the same error are three errors, whatever the console saw."""
    name = "errors_probe"  # in the catalog only: no runner runs it (status says stopped)
    with Catalog(system.dsn, SinkRoots.under(system.home)) as catalog:
        catalog.ensure(name, target_kind="delta", fingerprint="f", keep_generations=1,
                       definition={"sources": []})
        try:
            for _ in range(3):
                catalog.set_state(name, "retrying", error="TargetUnavailableError: down")

            def counted() -> dict[str, Any] | None:
                entry = next((p for p in system.overview()["projections"]
                              if p["name"] == name), None)
                return entry if entry is not None and entry["errors_total"] == 3 else None

            entry = wait_until(counted, what="the catalog's count in the overview")
            assert entry["last_error"] == "TargetUnavailableError: down"
            errors = scrape(system)["lakefold_projection_errors_total"][1]
            assert errors[(("projection", name),)] == 3
        finally:
            catalog.forget(name)


def test_every_metric_is_documented() -> None:
    page = (INFRA.parent / "docs" / "console.md").read_text()  # README links to it
    assert [n for n in METRICS if f"`{n}`" not in page] == []


def _rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            exprs.append(expr)
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["query"]["query"])
            assert match is not None, variable
            exprs.append(match[1])
    return exprs


def test_alert_rules_are_valid_and_name_only_exposed_metrics(system: System) -> None:
    exposed = set(scrape(system))
    rules = _rules()
    assert len(rules) >= 10
    names = [rule["alert"] for rule in rules]
    assert len(set(names)) == len(names)
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["labels"]["severity"] in ("warning", "critical"), rule
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        if "for" in rule:
            promql_parser.parse_duration(rule["for"])
        used = metric_names(rule["expr"])
        assert used and used <= exposed, (rule["alert"], used - exposed)
    assert {"lakefold_projection_state", "lakefold_projection_records_total",
            "lakefold_projection_dead_letters_total", "lakefold_capture_status",
            "lakefold_console_store_up"} <= set().union(*(metric_names(r["expr"])
                                                           for r in rules))


def test_the_dashboard_is_valid_and_draws_only_exposed_metrics(system: System) -> None:
    exposed = set(scrape(system))
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 30
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(set(ids)) == len(ids)
    used: set[str] = set()
    for expr in _dashboard_exprs():
        used |= metric_names(expr)
    assert used <= exposed, used - exposed
    counters = {n for n, (kind, _, _) in METRICS.items() if kind == "counter"}
    assert counters <= used  # every counter is drawn, as a rate
