"""deploy/prometheus/alerts.yml: structure, runbooks, and promtool's syntax check and unit tests."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest
import yaml

from tests.conftest import unavailable
from tests.ops.opslib import (
    ALERTS,
    ALERTS_TEST,
    INSTALL_HINT,
    METRIC_NAME,
    PROMETHEUS_DIR,
    REPO,
    alert_rules,
    find_tool,
    series_family,
)

# The list: token drift, duplicate BOS, tokenizer or template changed, analysis dropping,
# upstream error ratio, proxy down; the server parity probe's issue: the server's tokenizer differs; the bill's
# issue: the engine processed prompt tokens the usage through the sidecar does not account for.
REQUIRED = {
    "IslwatchEngineTokensUnaccounted",
    "IslwatchServerTokenizerDiffers",
    "IslwatchTokenDrift",
    "IslwatchDuplicateBOS",
    "IslwatchTokenizerChanged",
    "IslwatchAnalysisDropping",
    "IslwatchUpstreamErrors",
    "IslwatchProxyDown",
}
RULES = alert_rules()
NAMES = [r["alert"] for r in RULES]


def rule_id(rule: dict[str, Any]) -> str:
    return rule["alert"]


def test_required_alerts_present() -> None:
    assert set(NAMES) >= REQUIRED
    assert len(NAMES) == len(set(NAMES))


def test_server_tokenizer_differs_waits_five_minutes_at_zero() -> None:
    (rule,) = [r for r in RULES if r["alert"] == "IslwatchServerTokenizerDiffers"]
    assert rule["for"] == "5m" and rule["labels"]["severity"] == "warning"
    assert "islwatch_server_parity_ok" in rule["expr"] and rule["expr"].strip().endswith("== 0")


def test_engine_tokens_compare_the_engine_prompt_kind_with_usage() -> None:
    """The kind that counts what usage.prompt_tokens counts (cached included), against the usage sums."""
    (rule,) = [r for r in RULES if r["alert"] == "IslwatchEngineTokensUnaccounted"]
    assert 'islwatch_engine_tokens_total{kind="prompt"}' in rule["expr"]
    assert 'islwatch_isl_tokens_sum{kind="server"}' in rule["expr"]
    assert rule["for"] == "15m" and "by (instance)" in rule["expr"]


def test_token_drift_threshold_holds_for_ten_minutes() -> None:
    (rule,) = [r for r in RULES if r["alert"] == "IslwatchTokenDrift"]
    assert rule["for"] == "10m"
    assert 'result="exact"' in rule["expr"] and "< 0.99" in rule["expr"]


@pytest.mark.parametrize("rule", RULES, ids=rule_id)
def test_annotations(rule: dict[str, Any]) -> None:
    ann = rule["annotations"]
    assert ann["summary"].strip() and ann["description"].strip()
    assert rule["labels"]["severity"] in {"warning", "critical"}
    # The description names what the alert is about: the model where the expression keeps that label,
    # else the proxy instance (analysis pool and scrape health are per instance, not per model).
    keeps_model = re.search(r"\bby \(model\)", rule["expr"]) is not None
    wanted = "{{ $labels.model }}" if keeps_model else "{{ $labels.instance }}"
    assert wanted in ann["description"], rule["alert"]
    assert ann["runbook_url"] == f"docs/runbooks/{rule['alert'].lower()}.md"


@pytest.mark.parametrize("rule", RULES, ids=rule_id)
def test_runbook_page_exists(rule: dict[str, Any]) -> None:
    """The page `runbook_url` names is that alert's runbook (tests/docs builds it into the site)."""
    page = REPO / rule["annotations"]["runbook_url"]
    assert page.is_file(), f"no runbook page for {rule['alert']}"
    assert page.read_text().splitlines()[0] == f"# {rule['alert']}"


def test_every_runbook_page_is_an_alert() -> None:
    pages = {p.stem for p in (REPO / "docs" / "runbooks").glob("islwatch*.md")}
    assert pages == {name.lower() for name in NAMES}


@pytest.mark.parametrize("rule", RULES, ids=rule_id)
def test_rule_uses_exported_metrics(rule: dict[str, Any]) -> None:
    for name in METRIC_NAME.findall(rule["expr"]):
        assert series_family(name) is not None, f"{rule['alert']}: {name} is not exported by the proxy"


def unit_tests() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS_TEST.read_text())
    assert doc["rule_files"] == [ALERTS.name]
    return [case for test in doc["tests"] for case in test["alert_rule_test"]]


@pytest.mark.parametrize("name", NAMES)
def test_every_rule_has_a_firing_and_a_quiet_unit_test(name: str) -> None:
    cases = [c for c in unit_tests() if c["alertname"] == name]
    assert any(c["exp_alerts"] for c in cases), f"no test where {name} fires"
    assert any(not c["exp_alerts"] for c in cases), f"no test where {name} must stay quiet"


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = find_tool("promtool")
    if promtool is None:
        unavailable(f"promtool not found; {INSTALL_HINT}")
    return subprocess.run([promtool, *args], cwd=PROMETHEUS_DIR, capture_output=True, text=True, check=False)


def test_promtool_check_rules() -> None:
    result = run_promtool("check", "rules", ALERTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(RULES)} rules found" in result.stdout


def test_promtool_check_config() -> None:
    result = run_promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests() -> None:
    result = run_promtool("test", "rules", ALERTS_TEST.name)
    assert result.returncode == 0, result.stdout + result.stderr
