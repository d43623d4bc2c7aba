"""Goodput: the requests that met every SLO, as a share of the measured requests and as a rate. Pure.

As in vLLM's `calculate_metrics` (vllm/benchmarks/serve.py, 0.32): a request is good when each bounded
metric is at most its bound (`slo >= metric`) and goodput is good requests per second of the run. Here a
failed request is never good, and the bounds are `ttft_ms` (time to first content chunk), `itl_ms` (the
request's mean gap between content chunks; vLLM bounds its per-request TPOT, (e2e - ttft) / (tokens - 1),
which is the same number when each chunk is one token) and `e2e_ms`. A request with no measurement for a
bounded metric (a one-chunk stream has no inter-token gap) is not good: nothing shows it met the bound.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

from loadgen.send.replies import Record

FIELDS = {"ttft_ms": "ttft_ms", "itl_ms": "itl_ms", "e2e_ms": "latency_ms"}  # SLO name -> Record field


class Goodput(BaseModel):
    slo: dict[str, float]
    requests: int  # measured requests (warmup excluded), failed ones included
    good: int
    share: float | None  # good / requests
    rate: float  # good per second of the run
    missed: dict[str, int]  # per SLO, requests that missed it (a request can miss several)


def meets(r: Record, slo: dict[str, float]) -> bool:
    return r.status == 200 and r.error is None and not missed_bounds(r, slo)


def missed_bounds(r: Record, slo: dict[str, float]) -> list[str]:
    out = []
    for name, bound in slo.items():
        value = getattr(r, FIELDS[name])
        if value is None or value > bound:
            out.append(name)
    return out


def goodput(records: Sequence[Record], slo: dict[str, float], duration_s: float) -> Goodput:
    measured = [r for r in records if not r.warmup]
    good = sum(meets(r, slo) for r in measured)
    missed = dict.fromkeys(slo, 0)
    for r in measured:
        for name in missed_bounds(r, slo):
            missed[name] += 1
    return Goodput(
        slo=dict(slo),
        requests=len(measured),
        good=good,
        share=good / len(measured) if measured else None,
        rate=good / duration_s if duration_s > 0 else 0.0,
        missed=missed,
    )


def attained(g: Goodput | None, attainment: float) -> bool:
    """A run meets its SLOs when at least `attainment` of its requests were good (DistServe's "SLO
    attainment", OSDI '24, whose experiments ask 90%: the default of --slo-attainment)."""
    return g is not None and g.share is not None and g.share >= attainment
