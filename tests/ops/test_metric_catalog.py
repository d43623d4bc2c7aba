"""The metric table the dashboard and alerts are checked against equals what proxy.metrics exports."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry

from proxy.server.metrics import Metrics, build_metrics
from proxy.server.problems import ProblemLog
from proxy.server.records import AnalysisOutcome, TokenizerReport
from tests.ops.opslib import HISTOGRAMS, METRIC_LABELS, NO_SUM

IDENTITY = {
    "name": "builtin:mistral-v0.1",
    "revision": None,
    "template_sha256": "0" * 64,
    "tokenizer_sha256": "1" * 64,
    "transformers_version": "5",
}


def populated() -> Metrics:
    """A fresh registry where every metric has a series, each set through the methods the proxy itself
    calls: label names are then read from what is exported, not from the metric objects' internals."""
    metrics = build_metrics(CollectorRegistry(), process_metrics=False)
    metrics.relayed("m", "chat", 200)
    outcome = AnalysisOutcome(
        "chat", "m", 0.01, bare=3, templated=5, expected=5, server=6, match="mismatch",
        cause="duplicate_bos", fallback_reason="template_error", duplicate_bos_risk=True,
        output_tokens=4, cached_tokens=2, reasoning_tokens=1, images={"counted": 2}, image_tokens=8,
    )  # fmt: skip
    metrics.analysed(outcome, ProblemLog(logging.getLogger("test_metric_catalog")))
    metrics.engine_scraped(None)
    metrics.engine_counted("prompt", "vllm", 6)
    metrics.dropped()
    metrics.skipped("m", "chat")
    metrics.worker_exited()
    metrics.server_probed("m", True)
    metrics.tokenizers_loaded(
        [TokenizerReport("", "m", IDENTITY, True, "ok", fast_path_fallbacks=["render_differs"])]
    )
    metrics.dependency_info.labels("aiohttp", "3.14.5", "true").set(1)  # as app.start_servers sets it
    return metrics


def exported() -> dict[str, tuple[str, frozenset[str]]]:
    """Exposition name (with `_total` for counters) -> (type, label names), from a populated registry."""
    out = {}
    for family in populated().registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        samples = [s for s in family.samples if not s.name.endswith("_created")]
        assert samples, f"{name} has no series: its label names cannot be read"
        labels = {label for s in samples for label in s.labels}
        out[name] = (family.type, frozenset(labels - ({"le"} if family.type == "histogram" else set())))
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
    for per_request in (metrics.output_tokens, metrics.cached_prompt_tokens, metrics.reasoning_tokens):
        per_request.labels(model="m", endpoint="chat").observe(0)
    for per_request in (metrics.image_tokens, metrics.images_per_request):
        per_request.labels(model="m", endpoint="chat").observe(1)
    names = {s.name for family in metrics.registry.collect() for s in family.samples}
    for hist in HISTOGRAMS:
        assert {hist + "_bucket", hist + "_count"} <= names
        assert (hist + "_sum" in names) == (hist not in NO_SUM), hist
