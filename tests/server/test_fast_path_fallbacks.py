"""fast.py's shortcuts that turn themselves off are counted and logged at the server edge, once per reason:
a bug there would otherwise only make the proxy slower."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from proxy.server import metrics as metrics_module
from proxy.server.analyzer import AnalysisSpec, Analyzer
from proxy.server.metrics import build_metrics
from proxy.server.records import DEFAULT_KEY, TokenizerReport
from tests.server.helpers import parse_metrics, value

IDENTITY = {
    "name": "built:chatml",
    "revision": None,
    "template_sha256": "0" * 64,
    "tokenizer_sha256": "1" * 64,
    "transformers_version": "5",
}


def test_each_load_counts_its_fallbacks_and_each_reason_is_logged_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(metrics_module, "_FALLBACKS_LOGGED", set())
    registry = CollectorRegistry()
    metrics = build_metrics(registry, process_metrics=False)
    report = TokenizerReport("", "m", IDENTITY, True, "ok", fast_path_fallbacks=["direct_raised"])
    with caplog.at_level(logging.WARNING, logger="islwatch.metrics"):
        metrics.tokenizers_loaded([report])
        metrics.tokenizers_loaded([report])  # a reload, or a restarted worker
    samples = parse_metrics(generate_latest(registry).decode())
    assert value(samples, "islwatch_fast_path_fallbacks_total", reason="direct_raised") == 2
    lines = [r.getMessage() for r in caplog.records if "fast-path" in r.getMessage()]
    assert lines == ["a fast-path shortcut is off (direct_raised): analysis is slower, counts unchanged"]


def test_the_worker_reports_its_encoders_fallbacks() -> None:
    analyzer = Analyzer.load(AnalysisSpec(tokenizers=((DEFAULT_KEY, "builtin:mistral-v0.1"),)))
    (report,) = analyzer.describe()
    assert report.fast_path_fallbacks == []  # the built-in tokenizer takes every shortcut
    analyzer.entries[DEFAULT_KEY].model.encoder.fallbacks = ("render_differs",)  # type: ignore[attr-defined]
    (report,) = analyzer.describe()
    assert report.fast_path_fallbacks == ["render_differs"]
    assert TokenizerReport.from_row(report.as_row()) == report  # it crosses the worker pipe whole
