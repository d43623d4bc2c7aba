"""An islwatch proxy's own counts, read from its /metrics before and after a run, shown beside ours."""

from __future__ import annotations

import urllib.request
from collections.abc import Mapping

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


def diff(before: Counts, after: Counts) -> Counts:
    out: Counts = {}
    for name, values in after.items():
        prior = before.get(name, {})
        out[name] = {k: v - prior.get(k, 0.0) for k, v in values.items() if v - prior.get(k, 0.0)}
    return {k: v for k, v in out.items() if v}


def scrape(url: str, timeout: float = 5.0) -> Counts | None:
    """GET the metrics page; None (not an error) when the proxy cannot be reached."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return parse_counts(resp.read().decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None
