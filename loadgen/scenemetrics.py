"""A demo scene's numbers, read from the proxy's own /metrics: the loadgen's counters plus what the verdicts
and alert rules need (the drift histogram's buckets, the duplicate-BOS risk, tokenizer changes).

The loadgen's `proxymetrics.SHOWN` says which samples to sum; this adds a few and keeps zero increases,
because the drift buckets that stayed empty bound the median (proxymetrics.diff drops them).
"""

from __future__ import annotations

import time
import urllib.request

from .proxymetrics import SHOWN, Counts, parse_counts

DRIFT_BUCKETS = "islwatch_isl_drift_tokens_bucket"
SERVER_PARITY = "islwatch_server_parity_ok"
GAUGES = {SERVER_PARITY}  # a state, not a count: the scene's value is the last one, not an increase
SCENE_SAMPLES = {
    **SHOWN,
    DRIFT_BUCKETS: "le",
    "islwatch_duplicate_bos_risk_total": "",
    "islwatch_tokenizer_changes_total": "",
    SERVER_PARITY: "model",  # by model: the alert takes the minimum
}


def parse(text: str) -> Counts:
    """Each scene sample summed over its other labels (one model in the demo). Pure."""
    return parse_counts(text, SCENE_SAMPLES)


def increase(before: Counts, after: Counts) -> Counts:
    """What each counter gained between two scrapes, zeros kept; gauges as they are after. Pure."""
    return {
        name: values
        if name in GAUGES
        else {k: v - before.get(name, {}).get(k, 0.0) for k, v in values.items()}
        for name, values in after.items()
    }


def scrape(url: str, timeout: float = 5.0) -> Counts:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return parse(resp.read().decode("utf-8", "replace"))


def analysed(counts: Counts) -> float:
    """Requests the proxy has finished with: a match result, or dropped."""
    dropped = counts.get("islwatch_analysis_dropped_total", {}).get("all", 0.0)
    return sum(counts.get("islwatch_isl_match_total", {}).values()) + dropped


def settled(url: str, before: Counts, sent: int, wait_s: float = 10.0) -> Counts:
    """The scene's increase once the proxy has analysed all `sent` requests (analysis runs off the response
    path, so the last results land a little after the last answer), or whatever it has after `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        delta = increase(before, scrape(url))
        if analysed(delta) >= sent or time.monotonic() > deadline:
            return delta
        time.sleep(0.05)
