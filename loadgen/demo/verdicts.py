"""What a demo scene's /metrics numbers mean: the drift, its cause, which alert rule would fire, the verdict.

Pure: counts in (loadgen/send/proxy_metrics.py reads the `SCENE_SAMPLES`), numbers and sentences out. The alert conditions are
those of deploy/prometheus/alerts.yml, evaluated over the scene instead of a rate window: a scene is one
burst of traffic, so "the ratio over the last 5 minutes" is the ratio over the scene. The demo serves one
model, so the rules' `by (model)` is the sum. Three rules are left out: two need Prometheus's own view,
IslwatchProxyDown (`up == 0`: a proxy that answered the scrape is up) and IslwatchTokenizerIdentityDiverged
(hashes compared across replicas); IslwatchEngineTokensUnaccounted needs the engine's own counters
(`--upstream-metrics-url`), which the demo's emulator does not export.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loadgen.send.proxy_metrics import SHOWN, Counts

DRIFT_BUCKETS = "islwatch_isl_drift_tokens_bucket"
SERVER_PARITY = "islwatch_server_parity_ok"
GAUGES = {SERVER_PARITY}  # a state, not a count: the scene's value is the last one, not an increase
# What a scene reads: the loadgen's samples, plus what the verdicts and alert rules need. Zero increases are
# kept (proxy_metrics.increase), because the drift buckets that stayed empty bound the median.
SCENE_SAMPLES = {
    **SHOWN,
    DRIFT_BUCKETS: "le",
    "islwatch_duplicate_bos_risk_total": "",
    "islwatch_tokenizer_changes_total": "",
    SERVER_PARITY: "model",  # by model: the alert takes the minimum
}

# Why the server's count differs, in the operator's words (proxy/core/diagnose.py names the causes).
MEANING = {
    "duplicate_bos": "a second BOS",
    "hidden_system_prompt": "text the client never sent",
    "template_not_applied": "no chat template on the server",
    "generation_prompt_mismatch": "another generation prompt",
    "tools_unmodeled": "tools rendered the server's way",
    "media": "media placeholder tokens",
    "server_tokenizer_differs": "the server's tokenizer encodes differently",
    "unknown": "no known cause fits",
}


def _get(c: Counts, name: str, key: str = "all") -> float:
    return c.get(name, {}).get(key, 0.0)


def firing(c: Counts) -> tuple[str, ...]:
    """The alert rules of deploy/prometheus/alerts.yml whose condition holds on these increases."""
    match = c.get("islwatch_isl_match_total", {})
    compared = match.get("exact", 0.0) + match.get("mismatch", 0.0)
    requests = c.get("islwatch_requests_total", {})
    failed = requests.get("5xx", 0.0) + requests.get("error", 0.0)
    parity = c.get(SERVER_PARITY, {})  # absent when the server has no /tokenize: never an alert
    conditions = {
        "IslwatchTokenDrift": compared > 0 and match.get("exact", 0.0) / compared < 0.99,
        "IslwatchDuplicateBOS": _get(c, "islwatch_drift_total", "duplicate_bos") > 0
        or _get(c, "islwatch_duplicate_bos_risk_total") > 0,
        "IslwatchTokenizerChanged": _get(c, "islwatch_tokenizer_changes_total") > 0,
        "IslwatchServerTokenizerDiffers": bool(parity) and min(parity.values()) == 0,
        "IslwatchAnalysisDropping": _get(c, "islwatch_analysis_dropped_total") > 0,
        "IslwatchUpstreamErrors": sum(requests.values()) > 0 and failed / sum(requests.values()) > 0.05,
    }
    return tuple(sorted(name for name, holds in conditions.items() if holds))


@dataclass(frozen=True)
class Median:
    """The median drift's histogram bucket, (low, high]: exact when the bucket is one integer wide."""

    low: float
    high: float

    def __str__(self) -> str:
        def signed(x: float) -> str:
            return "0" if x == 0 else f"{x:+g}"

        if self.high - self.low == 1:
            return signed(self.high)
        if math.isinf(self.high):
            return f"> {signed(self.low)}"
        if math.isinf(self.low):
            return f"<= {signed(self.high)}"
        return f"{signed(self.low + 1)}..{signed(self.high)}"


def median_drift(buckets: dict[str, float]) -> Median | None:
    """The bucket holding the median of a cumulative histogram's increase (`le` -> count); None if empty."""
    pairs = sorted((float(le), n) for le, n in buckets.items())
    if not pairs or not pairs[-1][1]:
        return None
    half, low = pairs[-1][1] / 2, -math.inf
    for le, n in pairs:
        if n >= half:
            return Median(low, le)
        low = le
    return None  # unreachable: the +Inf bucket holds every observation


@dataclass(frozen=True)
class SceneNumbers:
    requests: int  # islwatch_requests_total
    compared: int  # analysed requests with a server count and a template (exact + mismatch)
    exact: int
    causes: dict[str, int]  # islwatch_drift_total by cause, exact included
    median: Median | None
    alerts: tuple[str, ...]

    @classmethod
    def of(cls, c: Counts) -> SceneNumbers:
        match = c.get("islwatch_isl_match_total", {})
        causes = {k: int(v) for k, v in c.get("islwatch_drift_total", {}).items() if v}
        return cls(
            requests=int(sum(c.get("islwatch_requests_total", {}).values())),
            compared=int(match.get("exact", 0) + match.get("mismatch", 0)),
            exact=int(match.get("exact", 0)),
            causes=causes,
            median=median_drift(c.get(DRIFT_BUCKETS, {})),
            alerts=firing(c),
        )

    @property
    def cause(self) -> str:
        """The most frequent cause of a difference; `exact` when nothing differed."""
        drifted = {k: v for k, v in self.causes.items() if k != "exact"}
        if not drifted:
            return "exact" if self.causes else "none"
        return max(sorted(drifted), key=lambda k: drifted[k])


def alert_text(alerts: tuple[str, ...]) -> str:
    return "would fire: " + ", ".join(alerts) if alerts else "no alert would fire"


def verdict(n: SceneNumbers) -> str:
    """One line, the way an operator wants to read it."""
    if not n.compared:
        return f"NO DATA: {n.requests} requests, none compared with a server count"
    if n.exact == n.compared:
        return f"OK: {n.exact}/{n.compared} requests exact (templated == server); {alert_text(n.alerts)}"
    unit = "token" if str(n.median) in ("+1", "-1") else "tokens"
    cause = n.cause
    return (
        f"DRIFT {n.median} {unit} on {n.compared - n.exact}/{n.compared} requests, cause {cause} "
        f"({MEANING.get(cause, cause)}); {alert_text(n.alerts)}"
    )


def surprise(expect_cause: str, expect_alerts: tuple[str, ...], n: SceneNumbers) -> str | None:
    """Why the numbers are not what the scene staged, or None when they are."""
    if n.cause != expect_cause:
        return f"expected cause {expect_cause}, the proxy's /metrics say {n.cause}"
    if n.alerts != tuple(sorted(expect_alerts)):
        return f"expected {alert_text(tuple(sorted(expect_alerts)))}, the numbers say {alert_text(n.alerts)}"
    return None


def summary_row(scene: str, n: SceneNumbers) -> tuple[str, ...]:
    """scene, requests, exact, median drift, cause, alert."""
    return (
        scene,
        str(n.requests),
        f"{n.exact}/{n.compared}",
        "-" if n.median is None else str(n.median),
        n.cause,
        ", ".join(n.alerts) or "-",
    )
