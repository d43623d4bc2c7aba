"""The metric table the dashboard and alerts are checked against equals what proxy.metrics exports."""

from __future__ import annotations

from opslib import HISTOGRAMS, METRIC_LABELS, NO_SUM
from prometheus_client import CollectorRegistry

from proxy.server.metrics import build_metrics


def exported() -> dict[str, tuple[str, frozenset[str]]]:
    """Exposition name (with `_total` for counters) -> (type, label names), from a fresh registry."""
    metrics = build_metrics(CollectorRegistry(), process_metrics=False)
    out = {}
    for family in metrics.registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        collector = metrics.registry._names_to_collectors[name]
        out[name] = (family.type, frozenset(collector._labelnames))
    return out


def test_catalog_matches_proxy_metrics() -> None:
    got = exported()
    assert set(got) == set(METRIC_LABELS)
    for name, labels in METRIC_LABELS.items():
        assert got[name][1] == labels, name


def test_histograms_are_histograms() -> None:
    got = exported()
    assert {n for n, (kind, _) in got.items() if kind == "histogram"} == HISTOGRAMS


def test_histograms_without_sum() -> None:
    """The series each histogram really exposes, including the missing `_sum` of the signed drift one."""
    metrics = build_metrics(CollectorRegistry(), process_metrics=False)
    metrics.isl_tokens.labels(model="m", endpoint="chat", kind="bare").observe(3)
    metrics.drift_tokens.labels(model="m", endpoint="chat").observe(-2)
    metrics.analysis_seconds.observe(0.01)
    names = {s.name for family in metrics.registry.collect() for s in family.samples}
    for hist in HISTOGRAMS:
        assert {hist + "_bucket", hist + "_count"} <= names
        assert (hist + "_sum" in names) == (hist not in NO_SUM), hist
