"""`--sweep V1,V2,...`: the same run once per load level, one summary table, and the knee.

The swept value replaces `--request-rate` (open loop), `--concurrency` (closed loop) or, with `--trace`,
`--trace-speedup`. Points run in ascending order, each with its own run id (`RUN-1`, `RUN-2`, ...: cache-bust
markers never repeat across points) and the tokenizer loaded once. The knee is the highest point up to which
every point met the SLOs (at least `--slo-attainment` of its requests within every `--slo` bound), so a
lucky point above a failing one is not the knee; without `--slo` there is no knee.
"""

from __future__ import annotations

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from loadgen.config import LoadgenConfig
from loadgen.report.goodput import attained
from loadgen.report.model import LoadgenReport, Percentiles
from loadgen.send.replies import Record
from proxy.core.tokenizer import LoadedTokenizer


class SweepPoint(BaseModel):
    value: float
    requests: int
    succeeded: int
    failed: int
    request_throughput: float
    output_token_throughput: float
    server_exact_rate: float | None
    ttft_p50: float | None
    ttft_p99: float | None
    itl_p50: float | None
    itl_p99: float | None
    e2e_p50: float | None
    e2e_p99: float | None
    goodput_share: float | None
    goodput_rate: float | None
    meets_slo: bool | None  # None without --slo


class SweepReport(BaseModel):
    axis: str  # the LoadgenConfig field swept
    points: list[SweepPoint]
    knee: float | None
    slo: dict[str, float] | None
    slo_attainment: float
    reports: list[LoadgenReport]


def axis(cfg: LoadgenConfig) -> str:
    if cfg.trace is not None:
        return "trace_speedup"
    return "request_rate" if cfg.request_rate is not None else "concurrency"


def point_config(cfg: LoadgenConfig, value: float, index: int) -> LoadgenConfig:
    field = axis(cfg)
    v: float | int = int(value) if field == "concurrency" else value
    return cfg.model_copy(update={field: v, "sweep": None, "run_id": f"{cfg.run_id}-{index + 1}"})


def _p(p: Percentiles | None, which: str) -> float | None:
    return None if p is None else float(getattr(p, which))


def summarize(value: float, r: LoadgenReport, slo: dict[str, float] | None, attainment: float) -> SweepPoint:
    g = r.goodput
    return SweepPoint(
        value=value,
        requests=r.requests,
        succeeded=r.succeeded,
        failed=r.failed,
        request_throughput=r.request_throughput,
        output_token_throughput=r.output_token_throughput,
        server_exact_rate=r.isl.server_exact_rate,
        ttft_p50=_p(r.ttft_ms, "p50"),
        ttft_p99=_p(r.ttft_ms, "p99"),
        itl_p50=_p(r.itl_ms, "p50"),
        itl_p99=_p(r.itl_ms, "p99"),
        e2e_p50=_p(r.latency_ms, "p50"),
        e2e_p99=_p(r.latency_ms, "p99"),
        goodput_share=None if g is None else g.share,
        goodput_rate=None if g is None else g.rate,
        meets_slo=None if slo is None else attained(g, attainment),
    )


def knee(points: list[SweepPoint]) -> float | None:
    """The highest value of the ascending run of points that all met the SLOs."""
    best = None
    for p in sorted(points, key=lambda p: p.value):
        if not p.meets_slo:
            break
        best = p.value
    return best


def _f(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def sweep_table(s: SweepReport) -> Table:
    t = Table(title=f"sweep over {s.axis.replace('_', ' ')}")
    cols = ["value", "ok/sent", "req/s", "out tok/s", "server exact", "TTFT p50/p99", "ITL p50/p99"]
    cols += ["E2E p50/p99"]
    if s.slo is not None:
        cols += ["goodput", "good req/s", "meets SLO"]
    for c in cols:
        t.add_column(c, justify="right")
    for p in s.points:
        row = [f"{p.value:g}", f"{p.succeeded}/{p.requests}", _f(p.request_throughput),
               _f(p.output_token_throughput), _pct(p.server_exact_rate),
               f"{_f(p.ttft_p50)} / {_f(p.ttft_p99)}", f"{_f(p.itl_p50, 2)} / {_f(p.itl_p99, 2)}",
               f"{_f(p.e2e_p50)} / {_f(p.e2e_p99)}"]  # fmt: skip
        if s.slo is not None:
            row += [_pct(p.goodput_share), _f(p.goodput_rate), "yes" if p.meets_slo else "no"]
        t.add_row(*row)
    return t


def knee_line(s: SweepReport) -> str:
    if s.slo is None:
        return "knee: give --slo to find the highest point that meets it"
    bounds = ", ".join(f"{k}<={v:g}" for k, v in s.slo.items())
    need = f"{s.slo_attainment * 100:g}% of requests within {bounds}"
    if s.knee is None:
        return f"knee: none; the lowest point already missed the SLOs ({need})"
    return f"knee: {s.axis.replace('_', ' ')} {s.knee:g} is the highest point meeting the SLOs ({need})"


Run = tuple[float | None, list[Record], LoadgenReport]


def run_sweep(cfg: LoadgenConfig, console: Console) -> tuple[int, SweepReport | None, list[Run]]:
    """Every point in ascending order; exit 2 if one cannot be prepared, else 0 when every point sent and
    every request succeeded, 1 otherwise."""
    from loadgen.report.table import print_overhead
    from loadgen.send.orchestrate import prepare, run_config  # I/O, imported when a sweep runs

    assert cfg.sweep
    values = sorted(cfg.sweep)
    loaded: LoadedTokenizer | None = None
    runs: list[Run] = []
    for i, value in enumerate(values):
        pcfg = point_config(cfg, value, i)
        console.rule(f"sweep point {i + 1}/{len(values)}: {axis(cfg).replace('_', ' ')} {value:g}")
        prepared = prepare(pcfg, loaded)
        loaded = prepared.loaded
        if i == 0:
            print_overhead(console, prepared.overhead, prepared.workload.landing.value)
        records, report = run_config(prepared.cfg, prepared, console)
        runs.append((value, records, report))
    points = [summarize(v, r, cfg.slo, cfg.slo_attainment) for v, _, r in runs if v is not None]
    result = SweepReport(
        axis=axis(cfg),
        points=points,
        knee=knee(points) if cfg.slo else None,
        slo=cfg.slo,
        slo_attainment=cfg.slo_attainment,
        reports=[r for _, _, r in runs],
    )
    console.print(sweep_table(result))
    console.print(knee_line(result))
    ok = all(r.succeeded == r.requests and r.requests for _, _, r in runs)
    return (0 if ok else 1), result, runs
