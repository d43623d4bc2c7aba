"""The run report: a pure function of the records (plus the run's setup), as a pydantic model."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from loadgen.report.goodput import Goodput
from loadgen.send.replies import Record


class Percentiles(BaseModel):
    n: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float


class IslSummary(BaseModel):
    requests: int  # measured requests that were built
    target_mean: float | None
    client_mean: float | None
    server_mean: float | None
    client_exact: int
    client_exact_rate: float | None
    server_reported: int
    server_exact: int
    server_exact_rate: float | None
    client_error: Percentiles | None  # |client templated - target|
    server_error: Percentiles | None  # |server usage - target|
    budget_errors: int
    budget_error_samples: list[str]


class CacheShare(BaseModel):
    """The prompt tokens the server says it served from its prefix cache: usage `cached_tokens`
    (`prompt_tokens_details` / `input_tokens_details`), over the requests whose usage reported it."""

    reported: int  # requests whose usage carried cached_tokens
    cached_tokens: int
    prompt_tokens: int  # the same requests' server prompt tokens
    share: float | None  # cached_tokens / prompt_tokens


class TurnSummary(BaseModel):
    turn: int
    requests: int
    turn_isl_mean: float
    target_mean: float
    client_mean: float | None = None  # achieved: the templated count measured on the wire body
    server_mean: float | None = None  # achieved: the server's usage.prompt_tokens
    client_exact_rate: float | None
    server_exact_rate: float | None
    cache: CacheShare | None = None


class Overheads(BaseModel):
    fixed: float
    wrap: float
    marker: float


class LoadgenReport(BaseModel):
    run_id: str
    config: dict[str, Any]
    tokenizer: dict[str, Any]
    overhead: Overheads | None
    requests: int
    succeeded: int
    failed: int
    warmup_excluded: int
    errors: dict[str, int]
    isl: IslSummary
    turns: list[TurnSummary]
    latency_ms: Percentiles | None
    ttft_ms: Percentiles | None
    itl_ms: Percentiles | None
    send_lateness_ms: Percentiles | None
    duration_s: float
    request_throughput: float
    output_token_throughput: float
    input_token_throughput: float
    proxy: dict[str, dict[str, float]] | None = None
    cache: CacheShare | None = None  # the whole run's prefix-cache share (per turn in `turns`)
    goodput: Goodput | None = None  # with --slo (loadgen/report/goodput.py)


def percentiles(values: Sequence[float]) -> Percentiles | None:
    """Linear-interpolated percentiles (numpy's default method)."""
    vals = sorted(v for v in values if v is not None and not math.isnan(v))
    if not vals:
        return None

    def q(p: float) -> float:
        pos = (len(vals) - 1) * p
        lo = math.floor(pos)
        hi = min(lo + 1, len(vals) - 1)
        return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)

    return Percentiles(
        n=len(vals), mean=sum(vals) / len(vals), p50=q(0.5), p90=q(0.9), p99=q(0.99), max=vals[-1]
    )


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _rate(hits: int, n: int) -> float | None:
    return hits / n if n else None


def isl_summary(records: Sequence[Record]) -> IslSummary:
    built = [r for r in records if r.client_isl is not None]
    served = [r for r in records if r.server_prompt_tokens is not None]
    client_exact = sum(r.client_isl == r.target_isl for r in built)
    server_exact = sum(r.server_prompt_tokens == r.target_isl for r in served)
    budget = [r.budget_error for r in records if r.budget_error]
    return IslSummary(
        requests=len(records),
        target_mean=_mean([r.target_isl for r in records]),
        client_mean=_mean([r.client_isl for r in built if r.client_isl is not None]),
        server_mean=_mean([r.server_prompt_tokens for r in served if r.server_prompt_tokens is not None]),
        client_exact=client_exact,
        client_exact_rate=_rate(client_exact, len(records)),
        server_reported=len(served),
        server_exact=server_exact,
        server_exact_rate=_rate(server_exact, len(served)),
        client_error=percentiles([abs((r.client_isl or 0) - r.target_isl) for r in built]),
        server_error=percentiles([abs((r.server_prompt_tokens or 0) - r.target_isl) for r in served]),
        budget_errors=len(budget),
        budget_error_samples=sorted(set(budget))[:5],
    )


def cache_share(records: Sequence[Record]) -> CacheShare:
    pairs = [
        (r.cached_prompt_tokens, r.server_prompt_tokens)
        for r in records
        if r.cached_prompt_tokens is not None and r.server_prompt_tokens is not None
    ]
    cached = sum(c for c, _ in pairs)
    prompt = sum(p for _, p in pairs)
    return CacheShare(
        reported=len(pairs), cached_tokens=cached, prompt_tokens=prompt, share=_rate(cached, prompt)
    )


def turn_summaries(records: Sequence[Record]) -> list[TurnSummary]:
    out = []
    for turn in sorted({r.turn for r in records}):
        rs = [r for r in records if r.turn == turn]
        served = [r for r in rs if r.server_prompt_tokens is not None]
        out.append(
            TurnSummary(
                turn=turn,
                requests=len(rs),
                turn_isl_mean=sum(r.turn_isl for r in rs) / len(rs),
                target_mean=sum(r.target_isl for r in rs) / len(rs),
                client_mean=_mean([r.client_isl for r in rs if r.client_isl is not None]),
                server_mean=_mean(
                    [r.server_prompt_tokens for r in served if r.server_prompt_tokens is not None]
                ),
                client_exact_rate=_rate(sum(r.client_isl == r.target_isl for r in rs), len(rs)),
                server_exact_rate=_rate(
                    sum(r.server_prompt_tokens == r.target_isl for r in served), len(served)
                ),
                cache=cache_share(rs),
            )
        )
    return out


def build_report(
    records: Sequence[Record],
    *,
    run_id: str,
    config: dict[str, Any],
    tokenizer: dict[str, Any],
    overhead: Overheads | None,
    proxy: dict[str, dict[str, float]] | None = None,
) -> LoadgenReport:
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.status == 200 and r.error is None]
    errors = Counter(r.error or "" for r in measured if r.error)
    ends = [r.sent_at + (r.latency_ms or 0) / 1000 for r in measured if r.latency_ms is not None]
    duration = (max(ends) - min(r.sent_at for r in measured)) if ends else 0.0
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    in_tokens = sum(r.client_isl or 0 for r in ok)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    return LoadgenReport(
        run_id=run_id,
        config=config,
        tokenizer=tokenizer,
        overhead=overhead,
        requests=len(measured),
        succeeded=len(ok),
        failed=len(measured) - len(ok),
        warmup_excluded=len(records) - len(measured),
        errors=dict(errors),
        isl=isl_summary(measured),
        turns=turn_summaries(measured),
        latency_ms=percentiles([r.latency_ms for r in ok if r.latency_ms is not None]),
        ttft_ms=percentiles([r.ttft_ms for r in ok if r.ttft_ms is not None]),
        itl_ms=percentiles([r.itl_ms for r in ok if r.itl_ms is not None]),
        send_lateness_ms=percentiles(
            [r.send_lateness_ms for r in measured if r.send_lateness_ms is not None]
        ),
        duration_s=duration,
        request_throughput=per_s(len(ok)),
        output_token_throughput=per_s(out_tokens),
        input_token_throughput=per_s(in_tokens),
        proxy=proxy,
        cache=cache_share(measured),
    )
