"""What `islwatch demo` prints around the loadgen's own report: scene headers, the proxy's numbers, the
verdicts, the summary table and where to point Prometheus and Grafana."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.rule import Rule
from rich.table import Table

from loadgen.demo.scenes import Scene
from loadgen.demo.verdicts import SceneNumbers, summary_row, verdict
from loadgen.send.proxy_metrics import Counts

REPO = Path(__file__).resolve().parents[1]  # deploy/ and grafana/ are there in a clone


def console() -> Console:
    """The terminal's width on a terminal; 120 columns into a pipe or a file, whatever COLUMNS says (rich's
    80 would fold the summary's names, and the output should read the same in a CI log as in the docs)."""
    return Console() if sys.stdout.isatty() else Console(width=120)


def scene_header(console: Console, number: int, total: int, scene: Scene) -> None:
    console.print(Rule(f"scene {number}/{total}: {scene.name}", align="left"))
    console.print(scene.title, markup=False, soft_wrap=True)


def _by_label(values: dict[str, float]) -> str:
    return " ".join(f"{k}={v:g}" for k, v in sorted(values.items()) if v) or "none"


def numbers(console: Console, delta: Counts, n: SceneNumbers) -> None:
    """The scene's counts as the proxy exported them (its /metrics, not the loadgen's)."""
    console.print(
        f"/metrics: {n.requests} requests; "
        f"islwatch_isl_match_total {_by_label(delta.get('islwatch_isl_match_total', {}))}; "
        f"islwatch_drift_total {_by_label(delta.get('islwatch_drift_total', {}))}; "
        f"drift median {'-' if n.median is None else n.median}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def lines(console: Console, text: list[str]) -> None:
    for line in text:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def scene_verdict(console: Console, n: SceneNumbers, surprise: str | None) -> None:
    style = "green" if n.compared and n.exact == n.compared else "yellow"
    console.print(
        f"verdict: {verdict(n)}", style=f"bold {style}", markup=False, highlight=False, soft_wrap=True
    )
    if surprise:
        console.print(
            f"islwatch demo: this scene did not go as staged: {surprise}", style="red", markup=False
        )


def summary(console: Console, rows: list[tuple[str, SceneNumbers]]) -> None:
    table = Table(title="islwatch demo: what the proxy's /metrics said, scene by scene")
    for col in ("scene", "requests", "exact", "median drift", "cause", "alert"):
        right = col in ("requests", "exact", "median drift")
        table.add_column(col, justify="right" if right else "left", overflow="fold")  # fold: names stay whole
    for name, n in rows:
        table.add_row(*summary_row(name, n))
    console.print(table)


def prometheus_config(admin: str) -> str:
    """A Prometheus config scraping this proxy as job `islwatch` (IslwatchProxyDown matches the job) and
    loading the repository's alert rules, when the demo runs from a clone."""
    rules = REPO / "deploy" / "prometheus" / "alerts.yml"
    text = "global:\n  scrape_interval: 5s\n  evaluation_interval: 5s\n"
    if rules.is_file():
        text += f"rule_files:\n  - {rules}\n"
    return (
        text + f"scrape_configs:\n  - job_name: islwatch\n    static_configs:\n      - targets: ['{admin}']\n"
    )


def where_to_look(console: Console, proxy_url: str, metrics_url: str, admin: str, logs: Path) -> None:
    config = logs / "prometheus.yml"
    config.write_text(prometheus_config(admin))
    dashboard = REPO / "grafana" / "islwatch.json"
    shown = dashboard if dashboard.is_file() else "grafana/islwatch.json from the islwatch repository"
    lines(
        console,
        [
            f"Send your own traffic through the proxy: {proxy_url}/v1/chat/completions",
            f"The proxy's metrics: {metrics_url} (try: curl -s {metrics_url} | grep islwatch_drift)",
            f"Prometheus: prometheus --config.file={config}   then http://127.0.0.1:9090/alerts",
            f"Grafana: add that Prometheus (http://127.0.0.1:9090) as a data source, import {shown}",
        ],
    )
