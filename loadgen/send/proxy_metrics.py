"""An islwatch proxy's own counts, read from its /metrics: before and after a loadgen run (shown beside
ours, in the report's proxy column) and for each demo scene (the verdicts read them).

The one scraper of the proxy's /metrics in the loadgen. `scrape` answers None when the proxy cannot be
reached (a loadgen run against a proxy whose admin port is closed is not an error); the demo, whose proxy is
its own child, turns None into an error where it needs the numbers.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Collection, Mapping

from prometheus_client.parser import text_string_to_metric_families

# sample name -> the label whose values we break the count down by
SHOWN = {
    "islwatch_requests_total": "status_class",
    "islwatch_isl_match_total": "result",
    "islwatch_drift_total": "cause",
    "islwatch_fallback_total": "reason",
    "islwatch_upstream_errors_total": "kind",
    "islwatch_analysis_dropped_total": "",
    "islwatch_isl_tokens_sum": "kind",
    "islwatch_isl_tokens_count": "kind",
}
Counts = dict[str, dict[str, float]]


def parse_counts(text: str, shown: Mapping[str, str] = SHOWN) -> Counts:
    """Sum the `shown` samples (name -> the label to break down by) over all other labels. Pure."""
    out: Counts = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            label = shown.get(sample.name)
            if label is None:
                continue
            key = sample.labels.get(label, "") if label else "all"
            bucket = out.setdefault(sample.name, {})
            bucket[key] = bucket.get(key, 0.0) + sample.value
    return out


def increase(before: Counts, after: Counts, gauges: Collection[str] = ()) -> Counts:
    """What each counter gained between two scrapes, zeros kept; `gauges` as they are after. Pure."""
    return {
        name: values
        if name in gauges
        else {k: v - before.get(name, {}).get(k, 0.0) for k, v in values.items()}
        for name, values in after.items()
    }


def nonzero(counts: Counts) -> Counts:
    """Only what changed (the report's proxy column). Pure."""
    out = {name: {k: v for k, v in values.items() if v} for name, values in counts.items()}
    return {k: v for k, v in out.items() if v}


def diff(before: Counts, after: Counts) -> Counts:
    """What each counter gained, zeros dropped. Pure."""
    return nonzero(increase(before, after))


def scrape(url: str, shown: Mapping[str, str] = SHOWN, timeout: float = 5.0) -> Counts | None:
    """GET the metrics page; None (not an error) when the proxy cannot be reached."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return parse_counts(resp.read().decode("utf-8", "replace"), shown)
    except (OSError, ValueError):
        return None


def analysed(counts: Counts) -> float:
    """Requests the proxy has finished with: a match result, or dropped."""
    dropped = sum(counts.get("islwatch_analysis_dropped_total", {}).values())
    return sum(counts.get("islwatch_isl_match_total", {}).values()) + dropped


def settled(
    url: str,
    before: Counts,
    sent: int,
    shown: Mapping[str, str] = SHOWN,
    gauges: Collection[str] = (),
    wait_s: float = 10.0,
) -> Counts | None:
    """The increase since `before` once the proxy has analysed all `sent` requests (it analyses off the
    response path, so the last results land a little after the last answer), or the last increase it
    could read after `wait_s` (None if it could read none)."""
    deadline = time.monotonic() + wait_s
    delta = None
    while True:
        after = scrape(url, shown)
        if after is not None:
            delta = increase(before, after, gauges)
            if analysed(delta) >= sent:
                return delta
        if time.monotonic() > deadline:
            return delta
        time.sleep(0.05)
