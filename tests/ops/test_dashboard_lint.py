"""grafana/islwatch.json against the rules of Grafana's dashboard-linter, and the issue's panel list.

Rule names are the linter's (github.com/grafana/dashboard-linter, lint/rule_*.go); job/instance rules are
left out on purpose (islwatch's metrics are filtered by model, not by job). Valid PromQL is checked offline
with promtool's parser here and against a live Prometheus in test_prometheus_live.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from tests.conftest import unavailable
from tests.ops.opslib import (
    DASHBOARD,
    INSTALL_HINT,
    METRIC_LABELS,
    METRIC_NAME,
    PROVISIONING,
    TARGET_LABELS,
    dashboard,
    dashboard_queries,
    data_panels,
    expand,
    find_tool,
    panels,
    promtool_parse,
    series_family,
)

DS_VARIABLE_NAMES = {"datasource", "prometheus_datasource"}  # the linter accepts either when there is one
DS_VARIABLE_LABELS = {"Data source", "Prometheus data source"}
DS_REFS = {"$datasource", "${datasource}"}
# Grafana unit ids (packages/grafana-data/src/valueFormats/categories.ts) this dashboard may use.
GRAFANA_UNITS = {"none", "string", "short", "percent", "percentunit", "reqps", "ops", "s", "ms", "bytes"}
COUNTER_FUNCS = ("rate", "irate", "increase")


@pytest.fixture(scope="module")
def dash() -> dict[str, Any]:
    return dashboard()


def ids(dash: dict[str, Any]) -> list[str]:
    return [q.panel + "/" + q.ref for q in dashboard_queries(dash)]


# --------------------------------------------------------------------------- dashboard-level rules


def test_template_datasource_rule(dash: dict[str, Any]) -> None:
    ds_vars = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
    assert len(ds_vars) == 1, "exactly one templated data source"
    (var,) = ds_vars
    assert var["name"] == "datasource" and var["name"] in DS_VARIABLE_NAMES
    assert var["label"] in DS_VARIABLE_LABELS
    assert var["query"] == "prometheus"


def test_template_on_time_change_reload_rule(dash: dict[str, Any]) -> None:
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            assert var["refresh"] == 2, f"variable {var['name']} must refresh on time range change"


def test_model_variable(dash: dict[str, Any]) -> None:
    (var,) = [v for v in dash["templating"]["list"] if v["name"] == "model"]
    assert var["type"] == "query"
    assert var["datasource"]["uid"] in DS_REFS
    assert var["definition"] == "label_values(islwatch_requests_total, model)"
    assert var["query"]["query"] == var["definition"]
    assert var["multi"] is True and var["includeAll"] is True
    # `All` must be a regex that matches every model: panels use model=~"$model".
    assert var["allValue"] == ".*"


def test_grafana_10_importable(dash: dict[str, Any]) -> None:
    assert dash["schemaVersion"] >= 36  # Grafana 9.0+ ; 10.x writes 37-39
    assert dash["uid"] and dash["title"]
    panel_ids = [p["id"] for p in panels(dash)]
    assert len(panel_ids) == len(set(panel_ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for p in panels(dash):
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, p["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"panel {p['title']!r} overlaps another"
                cells.add((x, y))


def test_provisioning_points_at_the_dashboard() -> None:
    ds = yaml.safe_load((PROVISIONING / "datasources" / "islwatch.yml").read_text())
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "islwatch.yml").read_text())["providers"]
    assert providers[0]["type"] == "file"
    # The compose file mounts grafana/ at the provider's path; checked in test_compose.py.
    assert providers[0]["options"]["path"].startswith("/var/lib/grafana/dashboards")
    assert DASHBOARD.name.endswith(".json")


# --------------------------------------------------------------------------- panel-level rules


def test_panel_datasource_rule(dash: dict[str, Any]) -> None:
    for p in data_panels(dash):
        assert p["datasource"]["uid"] in DS_REFS, p["title"]
        assert p["datasource"]["type"] == "prometheus", p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] in DS_REFS, f"{p['title']}/{t['refId']}"


def test_panel_units_rule(dash: dict[str, Any]) -> None:
    for p in data_panels(dash):
        unit = p["fieldConfig"]["defaults"].get("unit")
        assert unit in GRAFANA_UNITS, f"panel {p['title']!r} has no or an invalid unit: {unit!r}"
        overrides = [
            prop["value"]
            for o in p["fieldConfig"].get("overrides", [])
            for prop in o.get("properties", [])
            if prop.get("id") == "unit"
        ]
        assert all(u in GRAFANA_UNITS for u in overrides), p["title"]
        if p["type"] == "heatmap":  # the heatmap's axis has its own unit
            assert p["options"]["yAxis"]["unit"] == unit, p["title"]


def test_panel_title_description_rule(dash: dict[str, Any]) -> None:
    for p in data_panels(dash):
        assert p.get("title", "").strip(), p
        assert p.get("description", "").strip(), f"panel {p['title']!r} has no description"


def test_panel_no_targets_rule(dash: dict[str, Any]) -> None:
    for p in data_panels(dash):
        assert p.get("targets"), f"panel {p['title']!r} has no queries"


# --------------------------------------------------------------------------- target-level rules


def test_target_rate_interval_rule(dash: dict[str, Any]) -> None:
    """Stricter than the linter: every range selector, in rate or increase or anything, is $__rate_interval."""
    for q in dashboard_queries(dash):
        ranges = re.findall(r"\[([^\]]*)\]", q.expr)
        assert all(r == "$__rate_interval" for r in ranges), f"{q.panel}/{q.ref}: {q.expr}"


def test_target_counter_agg_rule(dash: dict[str, Any]) -> None:
    """Counters (`_total`, and histogram `_bucket`/`_sum`/`_count`) only inside rate/irate/increase."""
    counter_like = re.compile(r"\b(islwatch_[a-z0-9_]+_(?:total|bucket|sum|count))\b")
    for q in dashboard_queries(dash):
        for m in counter_like.finditer(q.expr):
            before = q.expr[: m.start()]
            assert before.endswith(tuple(f + "(" for f in COUNTER_FUNCS)), (
                f"{q.panel}: {m.group(1)} not in rate()"
            )


def test_targets_use_known_metrics_and_labels(dash: dict[str, Any]) -> None:
    """Every metric exists (per the proxy issue) and every label a query groups or filters by exists on it."""
    for q in dashboard_queries(dash):
        families = {series_family(n) for n in METRIC_NAME.findall(q.expr)}
        assert None not in families, f"{q.panel}: unknown metric in {q.expr}"
        known = set().union(*(METRIC_LABELS[f] for f in families if f)) | TARGET_LABELS
        used = set(re.findall(r"(\w+)\s*(?:=~|!=|!~|=)\s*\"", q.expr))
        for group in re.findall(r"\bby\s*\(([^)]*)\)", q.expr):
            used |= {label.strip() for label in group.split(",") if label.strip()}
        assert used <= known, f"{q.panel}: labels {used - known} not exported by {families}"


def test_model_filter_on_every_model_metric(dash: dict[str, Any]) -> None:
    """A selector of a metric with a model label filters by $model, or the model picker silently does nothing."""
    selector = re.compile(r"\b(islwatch_[a-z0-9_]+)\s*(\{[^}]*\})?")
    for q in dashboard_queries(dash):
        for m in selector.finditer(q.expr):
            family = series_family(m.group(1))
            if family and "model" in METRIC_LABELS[family]:
                assert 'model=~"$model"' in (m.group(2) or ""), f"{q.panel}: {m.group(0)}"


def test_target_promql_rule(dash: dict[str, Any]) -> None:
    """Every query parses with Prometheus' own parser (promtool), after Grafana's variable interpolation."""
    if find_tool("promtool") is None:
        unavailable(f"promtool not found; {INSTALL_HINT}")
    exprs = {f"{q.panel}/{q.ref}": expand(q.expr) for q in dashboard_queries(dash)}
    result = promtool_parse(exprs)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promql_check_rejects_a_bad_query() -> None:
    """The parse check above can fail: a broken query is refused."""
    if find_tool("promtool") is None:
        unavailable(f"promtool not found; {INSTALL_HINT}")
    result = promtool_parse({"bad": "sum by (model (rate(islwatch_requests_total[1m]))"})
    assert result.returncode != 0


# --------------------------------------------------------------------------- the issue's panel list


def panel_using(dash: dict[str, Any], metric: str, kind: str | None = None) -> list[str]:
    return [
        p["title"]
        for p in data_panels(dash)
        if (kind is None or p["type"] == kind) and any(metric in t["expr"] for t in p["targets"])
    ]


@pytest.mark.parametrize(
    ("metric", "kind"),
    [
        ("islwatch_isl_tokens_bucket", "timeseries"),  # ISL distributions by model and kind
        ("islwatch_isl_drift_tokens_bucket", "heatmap"),  # drift histogram
        ("islwatch_isl_match_total", "timeseries"),  # exact-match rate
        ("islwatch_drift_total", "timeseries"),  # drift causes
        ("islwatch_fallback_total", "timeseries"),
        ("islwatch_analysis_queue_depth", "timeseries"),
        ("islwatch_analysis_dropped_total", "timeseries"),
        ("islwatch_analysis_seconds_bucket", "timeseries"),
        ("islwatch_requests_total", "timeseries"),  # requests by status
        ("islwatch_upstream_errors_total", "timeseries"),
        ("islwatch_tokenizer_info", "table"),
        ("islwatch_server_parity_ok", "state-timeline"),  # server tokenizer parity
    ],
)
def test_issue_panels_present(dash: dict[str, Any], metric: str, kind: str) -> None:
    assert panel_using(dash, metric, kind), f"no {kind} panel on {metric}"


def test_isl_panels_split_by_kind_and_model(dash: dict[str, Any]) -> None:
    exprs = [
        t["expr"]
        for p in data_panels(dash)
        for t in p["targets"]
        if "islwatch_isl_tokens_bucket" in t["expr"]
    ]
    assert any(re.search(r"by \(model, kind, le\)", e) for e in exprs)


def test_drift_percentiles(dash: dict[str, Any]) -> None:
    quantiles = {
        float(m)
        for p in data_panels(dash)
        for t in p["targets"]
        if "islwatch_isl_drift_tokens_bucket" in t["expr"]
        for m in re.findall(r"histogram_quantile\(([0-9.]+)", t["expr"])
    }
    assert {0.5, 0.95} <= quantiles


def test_drift_causes_panel_shows_every_cause(dash: dict[str, Any]) -> None:
    """Split by cause and filtering out only `exact`: a new cause (server_tokenizer_differs) shows by itself."""
    (panel,) = [p for p in data_panels(dash) if p["title"] == "Drift causes"]
    (target,) = panel["targets"]
    assert re.search(r"by \(model, cause\)", target["expr"])
    assert re.findall(r"cause\s*(=~|!=|!~|=)\s*\"([^\"]*)\"", target["expr"]) == [("!=", "exact")]


def test_server_parity_panel(dash: dict[str, Any]) -> None:
    """Per model: 1 equal, 0 differs, and unknown (no series: no /tokenize) shown as such, never as equal."""
    (panel,) = [p for p in data_panels(dash) if p["title"] == "Server tokenizer parity"]
    (target,) = panel["targets"]
    assert re.search(r"by \(model\) \(islwatch_server_parity_ok\{", target["expr"])
    (mapping,) = panel["fieldConfig"]["defaults"]["mappings"]
    texts = {value: m["text"] for value, m in mapping["options"].items()}
    assert texts == {"1": "equal", "0": "differs", "-1": "unknown"}
    # unknown models come from the tokenizer info series, at -1
    assert "or -1 * max by (model) (islwatch_tokenizer_info{" in target["expr"]


def test_tokenizer_identity_table(dash: dict[str, Any]) -> None:
    (table,) = [p for p in data_panels(dash) if p["type"] == "table"]
    (target,) = table["targets"]
    assert target["format"] == "table" and target["instant"] is True
    for label in ("model", "template_sha256", "tokenizer_sha256", "tokenizer", "revision"):
        assert label in target["expr"]
    hidden = table["transformations"][0]["options"]["excludeByName"]
    assert hidden.get("Value") is True  # the info gauge's constant 1 is noise


def test_every_query_expands() -> None:
    """No variable other than $model and $__rate_interval reaches PromQL (the live test substitutes these)."""
    for q in dashboard_queries(dashboard()):
        assert "$" not in expand(q.expr, "30s", "m"), q
