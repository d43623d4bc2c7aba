"""islwatch's own bugs are counted as bugs, never turned into data: an exception out of islwatch's code in
an analysis is `islwatch_analysis_errors_total{stage}` plus one throttled log line with its frames (never
its message, which may quote the request), not a `template_error` / `tokenizer_error` fallback or an
`unknown` drift cause. The two true boundaries stay: a chat template that refuses the request is still a
`template_error` (the server refuses it too), and `Analyzer.analyze` never raises.

A bug has to be put in to be seen: each test breaks one piece of a real analyzer's state (a real tokenizer,
real jobs) the way a bug would, then runs the real analysis and metrics code."""

from __future__ import annotations

import dataclasses
import io
import logging
import secrets
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry

from proxy.core.fast import FastEncoder
from proxy.server.analyzer import AnalysisSpec, Analyzer
from proxy.server.frames import FRAME_HEAD, decode_outcome, encode_job
from proxy.server.metrics import Metrics, build_metrics
from proxy.server.problems import ProblemLog, traceback_line
from proxy.server.records import DEFAULT_KEY, AnalysisJob, AnalysisOutcome
from proxy.server.worker import serve_pipe

CANARY = "cnry" + secrets.token_hex(6)
CHAT = {"model": "m", "messages": [{"role": "user", "content": CANARY}]}
USAGE = orjson.dumps({"usage": {"prompt_tokens": 3}})  # not what islwatch counts: a mismatch to classify


@pytest.fixture(scope="module")
def analyzer() -> Analyzer:
    return Analyzer.load(AnalysisSpec(tokenizers=((DEFAULT_KEY, "builtin:mistral-v0.1"),)))


def job(body: dict[str, object] = CHAT, response: object = USAGE) -> AnalysisJob:
    return AnalysisJob("chat", "default", DEFAULT_KEY, orjson.dumps(body), response_json=response)


def broken(analyzer: Analyzer, **entry: object) -> Analyzer:
    """A copy of `analyzer` whose default entry has the given fields replaced (the bug)."""
    copy = Analyzer(analyzer.spec)
    copy.entries = {DEFAULT_KEY: dataclasses.replace(analyzer.entries[DEFAULT_KEY], **entry)}
    return copy


def applied(outcomes: list[AnalysisOutcome], caplog: pytest.LogCaptureFixture) -> Metrics:
    """The outcomes applied as the event loop applies them, with the problem log the pool uses."""
    metrics = build_metrics(CollectorRegistry(), process_metrics=False)
    problems = ProblemLog(logging.getLogger("islwatch.analysis"))
    with caplog.at_level(logging.DEBUG):
        for o in outcomes:
            metrics.analysed(o, problems)
    return metrics


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_a_bug_while_counting_is_an_analysis_error_not_a_fallback(
    analyzer: Analyzer, caplog: pytest.LogCaptureFixture
) -> None:
    model = analyzer.entries[DEFAULT_KEY].model
    encoder = FastEncoder(model.tokenizer)
    assert encoder.direct_proven
    encoder._backend = None  # the private tokenizer copy lost: every uncached encode fails an assertion
    bad = broken(analyzer, model=dataclasses.replace(model, encoder=encoder))
    outcomes = [bad.analyze(job()) for _ in range(5)]
    assert {(o.error_stage, o.fallback_reason, o.match) for o in outcomes} == {("count", None, None)}
    assert outcomes[0].detail is not None and outcomes[0].detail.startswith(
        "AssertionError at proxy/core/fast.py"
    )
    metrics = applied(outcomes, caplog)
    assert sample(metrics, "islwatch_analysis_errors_total", stage="count") == 5
    assert sample(metrics, "islwatch_fallback_total", model="default", reason="template_error") == 0
    lines = [r.getMessage() for r in caplog.records if "analysis_error_count" in r.getMessage()]
    assert len(lines) == 1 and "proxy/core/fast.py" in lines[0]  # one throttled line, with the frames
    assert CANARY not in caplog.text


def test_a_bug_while_classifying_is_an_analysis_error_not_an_unknown_cause(
    analyzer: Analyzer, caplog: pytest.LogCaptureFixture
) -> None:
    outcome = broken(analyzer, profile=None).analyze(job())
    assert outcome.error_stage == "classify" and outcome.cause is None
    assert outcome.detail is not None and "proxy/core/diagnose.py" in outcome.detail
    metrics = applied([outcome], caplog)
    assert sample(metrics, "islwatch_analysis_errors_total", stage="classify") == 1
    assert sample(metrics, "islwatch_drift_total", model="default", endpoint="chat", cause="unknown") == 0


def test_a_bug_while_reading_usage_is_an_analysis_error(
    analyzer: Analyzer, caplog: pytest.LogCaptureFixture
) -> None:
    outcome = analyzer.analyze(job(response=12345))  # the response tail handed over as the wrong type
    assert outcome.error_stage == "usage"
    assert sample(applied([outcome], caplog), "islwatch_analysis_errors_total", stage="usage") == 1


def test_a_template_that_refuses_the_request_is_still_data(
    analyzer: Analyzer, caplog: pytest.LogCaptureFixture
) -> None:
    """Mistral v0.1's template raises on a system role (raise_exception in the template): the server
    refuses such a request too, so it is a `template_error` fallback, counted bare, and no analysis error."""
    body = {**CHAT, "messages": [{"role": "system", "content": CANARY}, *CHAT["messages"]]}
    outcome = analyzer.analyze(job(body))
    assert outcome.error is None and outcome.fallback_reason == "template_error" and outcome.bare
    metrics = applied([outcome], caplog)
    assert sample(metrics, "islwatch_fallback_total", model="default", reason="template_error") == 1
    assert sample(metrics, "islwatch_analysis_errors_total", stage="count") == 0


def test_a_frame_the_worker_cannot_decode_is_counted_as_a_frame_error(
    analyzer: Analyzer, caplog: pytest.LogCaptureFixture
) -> None:
    good = encode_job(job())
    header = b"[not json " + CANARY.encode()
    bad = FRAME_HEAD.pack(len(header), 0) + header
    out = io.BytesIO()
    serve_pipe(analyzer, io.BytesIO(bad + good), out)
    rows = [orjson.loads(line) for line in out.getvalue().splitlines()]
    outcomes = [decode_outcome(row) for row in rows]
    assert [o.error_stage for o in outcomes] == ["frame", None]  # and the worker went on
    assert outcomes[1].match == "mismatch"
    metrics = applied(outcomes, caplog)
    assert sample(metrics, "islwatch_analysis_errors_total", stage="frame") == 1
    assert CANARY not in caplog.text


def test_a_traceback_line_names_the_frames_never_the_message() -> None:
    def parse(text: str) -> None:
        raise KeyError(f"no field in {text!r}")

    try:
        parse(CANARY)
    except KeyError as exc:
        line = traceback_line(exc)
    assert line.startswith("KeyError at test_internal_errors.py:")  # innermost first, the path shortened
    assert " parse < " in line and str(Path(__file__).parent) not in line
    assert CANARY not in line and "no field" not in line and "\n" not in line
