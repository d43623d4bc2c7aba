"""Helpers shared by the ops tests: where the artifacts are, the dashboard's queries, the Prometheus binaries.

Kept free of pytest fixtures so each test module reads top to bottom; `conftest.py` next to it wraps these.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "grafana" / "islwatch.json"
PROVISIONING = REPO / "grafana" / "provisioning"
PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
ALERTS_TEST = PROMETHEUS_DIR / "alerts_test.yml"
K8S = REPO / "deploy" / "k8s"
COMPOSE_DIR = REPO / "deploy" / "compose"
DOCKERFILE = REPO / "Dockerfile"
README = REPO / "README.md"

# Where scripts/install_prometheus.sh puts the binaries (same default, same variable).
PROMETHEUS_HOME = Path(os.environ.get("ISLWATCH_PROMETHEUS_HOME", "/opt/islwatch/prometheus"))
INSTALL_HINT = "run `bash scripts/install_prometheus.sh` (Debian's prometheus package)"

# Every metric the proxy exports per the proxy issue, with its labels. The dashboard and the alerts may only
# use these; tests also compare this table with proxy.metrics when that module exists.
METRIC_LABELS: dict[str, frozenset[str]] = {
    "islwatch_requests_total": frozenset({"model", "endpoint", "status_class"}),
    "islwatch_isl_tokens": frozenset({"model", "endpoint", "kind"}),
    "islwatch_isl_drift_tokens": frozenset({"model", "endpoint"}),
    "islwatch_isl_match_total": frozenset({"model", "endpoint", "result"}),
    "islwatch_drift_total": frozenset({"model", "endpoint", "cause"}),
    "islwatch_duplicate_bos_risk_total": frozenset({"model", "endpoint"}),
    "islwatch_analysis_seconds": frozenset(),
    "islwatch_analysis_reused_total": frozenset(),
    "islwatch_analysis_dropped_total": frozenset(),
    "islwatch_analysis_skipped_total": frozenset({"model", "endpoint"}),
    "islwatch_analysis_worker_exits_total": frozenset(),
    "islwatch_analysis_queue_depth": frozenset(),
    "islwatch_analysis_workers_live": frozenset(),
    "islwatch_fallback_total": frozenset({"model", "reason"}),
    "islwatch_upstream_errors_total": frozenset({"kind"}),
    "islwatch_upstream_retries_total": frozenset(),
    "islwatch_stream_usage_injections_total": frozenset({"result"}),
    "islwatch_bad_requests_total": frozenset({"reason"}),
    "islwatch_tokenizer_info": frozenset(
        {"model", "tokenizer", "revision", "template_sha256", "tokenizer_sha256", "transformers_version"}
        | {"tokenizer_class", "renderer"}
    ),
    "islwatch_tokenizer_changes_total": frozenset({"model"}),
    "islwatch_parity_ok": frozenset({"model"}),
    # The server parity probe (proxy/core/probe.py): 1 every probe equal, 0 some differ, absent while unknown.
    "islwatch_server_parity_ok": frozenset({"model"}),
    "islwatch_build_info": frozenset({"version"}),
    "islwatch_dependency_info": frozenset({"library", "version", "tested"}),
    "islwatch_fast_path_fallbacks_total": frozenset({"reason"}),
    # Client connections (proxy/server/guard.py) and islwatch's own bugs (issue 13).
    "islwatch_client_connections": frozenset(),
    "islwatch_client_connections_cut_total": frozenset({"reason"}),
    "islwatch_client_disconnects_total": frozenset({"stage"}),
    "islwatch_analysis_errors_total": frozenset({"stage"}),
    "islwatch_proxy_errors_total": frozenset(),
    # The global body budget (proxy/server/budget.py) and the admin port's cap (proxy/server/exposition.py).
    "islwatch_inflight_body_bytes": frozenset(),
    "islwatch_body_budget_total": frozenset({"event"}),
    "islwatch_admin_requests_refused_total": frozenset({"reason"}),
    # The rest of usage (issue 15): per request, and which fields each answer reported at all.
    "islwatch_output_tokens": frozenset({"model", "endpoint"}),
    "islwatch_cached_prompt_tokens": frozenset({"model", "endpoint"}),
    "islwatch_reasoning_tokens": frozenset({"model", "endpoint"}),
    "islwatch_usage_fields_total": frozenset({"model", "field", "present"}),
    # The engine's own counters (--upstream-metrics-url): their increase since islwatch started.
    "islwatch_engine_tokens_total": frozenset({"kind", "engine"}),
    "islwatch_engine_scrapes_total": frozenset({"result"}),
    # Images (issue 21, proxy/core/images.py): per request, and what became of each image part.
    "islwatch_image_tokens": frozenset({"model", "endpoint"}),
    "islwatch_images_per_request": frozenset({"model", "endpoint"}),
    "islwatch_images_total": frozenset({"model", "endpoint", "result"}),
}
HISTOGRAMS = frozenset(
    {
        "islwatch_isl_tokens",
        "islwatch_isl_drift_tokens",
        "islwatch_analysis_seconds",
        "islwatch_output_tokens",
        "islwatch_cached_prompt_tokens",
        "islwatch_reasoning_tokens",
        "islwatch_image_tokens",
        "islwatch_images_per_request",
    }
)
# prometheus_client exports no `_sum` for a histogram with negative buckets (a sum that can go down is
# not a counter), so the signed drift histogram has only `_bucket` and `_count`.
NO_SUM = frozenset({"islwatch_isl_drift_tokens"})
# Labels Prometheus attaches at scrape time (and `le` of histogram series).
TARGET_LABELS = frozenset({"instance", "job", "le"})

METRIC_NAME = re.compile(r"\b(islwatch_[a-z0-9_]+)")


def series_family(name: str) -> str | None:
    """`islwatch_isl_tokens_bucket` -> `islwatch_isl_tokens`; None for names the proxy does not export."""
    if name in METRIC_LABELS:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        family = name.removesuffix(suffix)
        if name.endswith(suffix) and family in HISTOGRAMS and not (suffix == "_sum" and family in NO_SUM):
            return family
    return None


@lru_cache(maxsize=1)
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows included, and panels nested in collapsed rows."""
    for panel in dash.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def data_panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    return (p for p in panels(dash) if p.get("type") != "row")


@dataclass(frozen=True)
class DashboardQuery:
    panel: str
    ref: str
    expr: str
    instant: bool


def dashboard_queries(dash: dict[str, Any]) -> list[DashboardQuery]:
    return [
        DashboardQuery(p["title"], t.get("refId", "?"), t["expr"], bool(t.get("instant")))
        for p in data_panels(dash)
        for t in p.get("targets", [])
        if t.get("expr")
    ]


def expand(expr: str, rate_interval: str = "1m", model: str = ".*") -> str:
    """Grafana's variable interpolation for this dashboard: `$model` is a regex (multi-value, `All` = `.*`)."""
    out = expr.replace("${__rate_interval}", rate_interval).replace("$__rate_interval", rate_interval)
    out = out.replace("${model}", model).replace("$model", model)
    if "$" in out:
        raise ValueError(f"unexpanded variable in {expr!r}")
    return out


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def find_tool(name: str) -> str | None:
    """`prometheus` or `promtool`: $ISLWATCH_PROMETHEUS / $ISLWATCH_PROMTOOL (what
    `eval "$(bash scripts/install_prometheus.sh)"` exports), the install script's dir, then PATH."""
    explicit = os.environ.get(f"ISLWATCH_{name.upper()}")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    candidate = PROMETHEUS_HOME / "bin" / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which(name)


def promtool_parse(exprs: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Parse PromQL with the real parser, offline: each expression becomes a recording rule for
    `promtool check rules` (which parses every `expr`). Keys name the rules."""
    promtool = find_tool("promtool")
    if promtool is None:
        raise FileNotFoundError(f"promtool not found; {INSTALL_HINT}")
    rules = [{"record": f"islwatch:check:{i}", "expr": expr} for i, expr in enumerate(exprs.values())]
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as fh:
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, fh)
        fh.flush()
        return subprocess.run(
            [promtool, "check", "rules", fh.name], capture_output=True, text=True, check=False
        )
