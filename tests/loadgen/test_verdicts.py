"""The demo's verdicts: which alert rule would fire, the median drift, the one-line verdict, the summary row.

Pure functions on counts; the counts are parsed from the real export of islwatch's own metrics registry.
"""

from __future__ import annotations

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from loadgen.demo.scenes import SCENES
from loadgen.demo.verdicts import (
    DRIFT_BUCKETS,
    GAUGES,
    SCENE_SAMPLES,
    Median,
    SceneNumbers,
    firing,
    median_drift,
    summary_row,
    surprise,
    verdict,
)
from loadgen.send.proxy_metrics import increase, parse_counts
from proxy.server.metrics import Metrics, build_metrics
from tests.conftest import REPO

# Two need Prometheus's own view; one the engine's counters, which the demo's emulator does not export.
NOT_EVALUATED = {"IslwatchProxyDown", "IslwatchTokenizerIdentityDiverged", "IslwatchEngineTokensUnaccounted"}


def counts(**by_name: dict[str, float]) -> dict[str, dict[str, float]]:
    return {f"islwatch_{name}_total": values for name, values in by_name.items()}


@pytest.mark.parametrize(
    ("c", "expected"),
    [
        ({}, ()),
        (counts(isl_match={"exact": 40}, drift={"exact": 40}, requests={"2xx": 40}), ()),
        (
            counts(isl_match={"mismatch": 40}, drift={"duplicate_bos": 40}),
            ("IslwatchDuplicateBOS", "IslwatchTokenDrift"),
        ),
        (counts(isl_match={"exact": 3}, duplicate_bos_risk={"all": 3}), ("IslwatchDuplicateBOS",)),
        (counts(isl_match={"exact": 99, "mismatch": 1}), ()),  # 99% is the threshold, not below it
        (counts(isl_match={"exact": 98, "mismatch": 2}, drift={"unknown": 2}), ("IslwatchTokenDrift",)),
        (counts(isl_match={"no_server_count": 5, "no_template": 5}), ()),  # no evidence either way
        (counts(tokenizer_changes={"all": 1}), ("IslwatchTokenizerChanged",)),
        ({"islwatch_server_parity_ok": {"a": 1, "b": 0}}, ("IslwatchServerTokenizerDiffers",)),
        ({"islwatch_server_parity_ok": {"a": 1}}, ()),
        (counts(analysis_dropped={"all": 1}), ("IslwatchAnalysisDropping",)),
        (counts(requests={"2xx": 94, "5xx": 3, "error": 3}), ("IslwatchUpstreamErrors",)),
        (counts(requests={"2xx": 95, "5xx": 5}), ()),  # 5% exactly does not exceed 5%
    ],
)
def test_which_alert_would_fire(c: dict[str, dict[str, float]], expected: tuple[str, ...]) -> None:
    assert firing(c) == expected


def test_the_evaluated_rules_are_the_rules_of_alerts_yml() -> None:
    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "alerts.yml").read_text())["groups"][0]["rules"]
    names = {r["alert"] for r in rules}
    everything = counts(
        isl_match={"mismatch": 1},
        drift={"duplicate_bos": 1},
        tokenizer_changes={"all": 1},
        analysis_dropped={"all": 1},
        requests={"5xx": 1},
    ) | {"islwatch_server_parity_ok": {"default": 0}}
    assert set(firing(everything)) == names - NOT_EVALUATED


def test_the_median_drift_is_read_from_cumulative_buckets() -> None:
    one = {"0.0": 0, "1.0": 40, "2.0": 40, "+Inf": 40}
    assert median_drift(one) == Median(0, 1) and str(Median(0, 1)) == "+1"
    assert str(median_drift({"-1.0": 0, "0.0": 6, "+Inf": 6})) == "0"
    assert str(median_drift({"-3.0": 0, "-2.0": 5, "+Inf": 5})) == "-2"
    assert str(median_drift({"10.0": 0, "20.0": 3, "+Inf": 3})) == "+11..+20"
    assert str(median_drift({"1000.0": 0, "+Inf": 2})) == "> +1000"
    assert str(median_drift({"0.0": 2, "7.0": 2, "8.0": 3, "+Inf": 5})) == "+8"  # the middle one's bucket
    assert str(median_drift({"-1000.0": 3, "+Inf": 3})) == "<= -1000"
    assert median_drift({}) is None and median_drift({"+Inf": 0}) is None


def scene_numbers(observe: list[tuple[str, int]], exact: int = 0) -> SceneNumbers:
    """Numbers parsed from islwatch's own registry after `observe` (cause, drift) per request."""
    registry = CollectorRegistry()
    m: Metrics = build_metrics(registry, process_metrics=False)
    before = parse_counts(generate_latest(registry).decode(), SCENE_SAMPLES)
    for cause, drift in [("exact", 0)] * exact + observe:
        m.requests.labels("default", "chat", "2xx").inc()
        m.match.labels("default", "chat", "exact" if cause == "exact" else "mismatch").inc()
        m.drift.labels("default", "chat", cause).inc()
        m.drift_tokens.labels("default", "chat").observe(drift)
    return SceneNumbers.of(
        increase(before, parse_counts(generate_latest(registry).decode(), SCENE_SAMPLES), GAUGES)
    )


def test_numbers_and_verdicts_from_the_real_export() -> None:
    ok = scene_numbers([], exact=40)
    assert (ok.requests, ok.compared, ok.exact, ok.cause, str(ok.median), ok.alerts) == (
        40, 40, 40, "exact", "0", ()
    )  # fmt: skip
    assert verdict(ok) == "OK: 40/40 requests exact (templated == server); no alert would fire"
    bos = scene_numbers([("duplicate_bos", 1)] * 40)
    assert verdict(bos) == (
        "DRIFT +1 token on 40/40 requests, cause duplicate_bos (a second BOS); "
        "would fire: IslwatchDuplicateBOS, IslwatchTokenDrift"
    )
    assert summary_row("double-bos", bos) == (
        "double-bos", "40", "0/40", "+1", "duplicate_bos", "IslwatchDuplicateBOS, IslwatchTokenDrift"
    )  # fmt: skip
    mixed = scene_numbers([("hidden_system_prompt", 8)] * 3 + [("unknown", 2)], exact=1)
    assert (mixed.cause, str(mixed.median)) == ("hidden_system_prompt", "+8")
    assert (mixed.exact, mixed.compared) == (1, 5)
    assert verdict(mixed).startswith("DRIFT +8 tokens on 4/5 requests, cause hidden_system_prompt")


def test_a_gauge_is_its_last_value_not_an_increase() -> None:
    delta = increase({"islwatch_server_parity_ok": {"m": 1}}, {"islwatch_server_parity_ok": {"m": 1}}, GAUGES)
    assert delta == {"islwatch_server_parity_ok": {"m": 1}} and firing(delta) == ()


def test_zero_buckets_survive_the_increase() -> None:
    """The empty buckets below the median bound it: +1 is exact only because bucket 0 is kept at 0."""
    registry = CollectorRegistry()
    m = build_metrics(registry, process_metrics=False)
    m.drift_tokens.labels("default", "chat").observe(1)
    delta = increase({}, parse_counts(generate_latest(registry).decode(), SCENE_SAMPLES))
    assert delta[DRIFT_BUCKETS]["0.0"] == 0 and delta[DRIFT_BUCKETS]["1.0"] == 1


def test_a_scene_that_goes_otherwise_than_staged_is_reported() -> None:
    bos = next(s for s in SCENES if s.name == "double-bos")
    assert surprise(bos.expect_cause, bos.expect_alerts, scene_numbers([("duplicate_bos", 1)] * 4)) is None
    said = surprise(bos.expect_cause, bos.expect_alerts, scene_numbers([("unknown", 1)] * 4))
    assert said == "expected cause duplicate_bos, the proxy's /metrics say unknown"
    assert surprise("exact", (), scene_numbers([], exact=2)) is None
    assert verdict(SceneNumbers.of({})).startswith("NO DATA")
