"""The pure report and the proxy-metrics reader."""

from __future__ import annotations

from loadgen.report.model import build_report, percentiles
from loadgen.send.proxy_metrics import diff, parse_counts
from loadgen.send.replies import Record


def rec(target: int, client: int | None, server: int | None, **kw: object) -> Record:
    base = dict(
        conversation="c0", turn=1, warmup=False, turn_isl=target, target_isl=target, client_isl=client,
        server_prompt_tokens=server, reply_tokens=0, output_tokens=10, status=200, error=None,
        budget_error=None, sent_at=100.0, scheduled_at=None, send_lateness_ms=None, latency_ms=500.0,
        ttft_ms=None, itl_ms=None,
    )  # fmt: skip
    return Record(**{**base, **kw})  # type: ignore[arg-type]


def test_percentiles_interpolate() -> None:
    p = percentiles([1.0, 2.0, 3.0, 4.0])
    assert p is not None and p.p50 == 2.5 and p.max == 4.0 and p.mean == 2.5


def test_percentiles_of_nothing_is_none() -> None:
    assert percentiles([]) is None


def test_exact_rates_and_errors() -> None:
    records = [
        rec(100, 100, 100),
        rec(100, 100, 101),
        rec(100, 99, None, budget_error="no exact text for target 100 (closest 99)"),
        rec(100, 100, 100, warmup=True),
        rec(100, 100, None, status=None, error="ClientConnectorError", latency_ms=None),
    ]
    r = build_report(records, run_id="r", config={}, tokenizer={}, overhead=None)
    assert r.requests == 4 and r.warmup_excluded == 1 and r.failed == 1
    assert r.isl.client_exact == 3 and r.isl.client_exact_rate == 0.75
    assert r.isl.server_reported == 2 and r.isl.server_exact == 1
    assert r.isl.server_error is not None and r.isl.server_error.max == 1
    assert r.isl.budget_errors == 1 and r.errors == {"ClientConnectorError": 1}
    assert r.duration_s == 0.5 and r.request_throughput == 6.0


METRICS = """# TYPE islwatch_isl_match_total counter
islwatch_isl_match_total{model="default",endpoint="chat",result="exact"} %d
islwatch_isl_match_total{model="other",endpoint="chat",result="exact"} 1
islwatch_isl_match_total{model="default",endpoint="chat",result="mismatch"} %d
# TYPE islwatch_analysis_dropped_total counter
islwatch_analysis_dropped_total 0
"""


def test_proxy_counts_are_summed_and_diffed() -> None:
    before = parse_counts(METRICS % (5, 1))
    after = parse_counts(METRICS % (12, 2))
    assert before["islwatch_isl_match_total"] == {"exact": 6.0, "mismatch": 1.0}
    assert diff(before, after) == {"islwatch_isl_match_total": {"exact": 7.0, "mismatch": 1.0}}
