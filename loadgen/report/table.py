"""Rich rendering of a LoadgenReport (the overhead line at start, the final tables)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from loadgen.report.model import LoadgenReport, Overheads, Percentiles


def _f(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.2f}%"


def print_overhead(console: Console, o: Overheads, target: str) -> None:
    console.print(
        f"template overhead: fixed {o.fixed:.2f} tokens/request, wrap {o.wrap:.2f} tokens/message, "
        f"marker {o.marker:.2f} tokens (mean of 8); cache-bust marker lands on: {target}"
    )


def _pct_row(name: str, p: Percentiles | None, digits: int = 2) -> list[str]:
    if p is None:
        return [name, "-", "-", "-", "-", "-", "0"]
    return [
        name,
        _f(p.mean, digits),
        _f(p.p50, digits),
        _f(p.p90, digits),
        _f(p.p99, digits),
        _f(p.max, digits),
        str(p.n),
    ]


def _isl_table(r: LoadgenReport) -> Table:
    isl = r.isl
    t = Table(title=f"ISL: target vs achieved (run {r.run_id})")
    t.add_column("", no_wrap=True)
    for col in ("mean", "exact", "rate", "p50 err", "p90 err", "p99 err", "max err"):
        t.add_column(col, justify="right")
    t.add_row("target (budget)", _f(isl.target_mean), "", "", "", "", "", "")
    for name, mean, exact, rate, err, n in (
        (
            "client templated",
            isl.client_mean,
            isl.client_exact,
            isl.client_exact_rate,
            isl.client_error,
            isl.requests,
        ),
        (
            "server usage",
            isl.server_mean,
            isl.server_exact,
            isl.server_exact_rate,
            isl.server_error,
            isl.server_reported,
        ),
    ):
        e = err
        t.add_row(
            name,
            _f(mean),
            f"{exact}/{n}",
            _pct(rate),
            _f(e.p50 if e else None, 0),
            _f(e.p90 if e else None, 0),
            _f(e.p99 if e else None, 0),
            _f(e.max if e else None, 0),
        )
    if r.proxy is not None:
        match = r.proxy.get("islwatch_isl_match_total", {})
        total = int(sum(match.values()))
        exact = int(match.get("exact", 0))
        others = ", ".join(f"{k} {v:g}" for k, v in sorted(match.items()) if k != "exact")
        t.add_row("proxy's own match", "", f"{exact}/{total}", _pct(exact / total if total else None), others,
                  "", "", "")  # fmt: skip
    return t


def turn_label(r: LoadgenReport) -> str:
    """The per-turn table's first column: an agent conversation's request k carries k - 1 rounds."""
    return "round" if r.config.get("workload") == "agent" else "turn"


def turn_rows(r: LoadgenReport) -> list[list[str]]:
    """Per turn (agent: per round): the target and what was achieved, client-side and by the server."""
    shift = 1 if turn_label(r) == "round" else 0
    return [
        [str(s.turn - shift), str(s.requests), _f(s.turn_isl_mean), _f(s.target_mean), _f(s.client_mean),
         _f(s.server_mean), _pct(s.client_exact_rate), _pct(s.server_exact_rate)]
        for s in r.turns
    ]  # fmt: skip


TURN_COLUMNS = ("requests", "ISL added", "target (whole request)", "client (mean)", "server (mean)",
                "client exact", "server exact")  # fmt: skip


def _turn_table(r: LoadgenReport) -> Table:
    label = turn_label(r)
    tt = Table(title="per round: target vs achieved" if label == "round" else "per turn: target vs achieved")
    for col in (label, *TURN_COLUMNS):
        tt.add_column(col, justify="right")
    for row in turn_rows(r):
        tt.add_row(*row)
    return tt


def _cache_table(r: LoadgenReport) -> Table:
    """Per turn, the share of prompt tokens the server served from its prefix cache (its usage says so).
    With a cache-bust marker only the part before it can be shared by another conversation or run."""
    target = r.config.get("cache_bust", "none")
    ct = Table(title=f"prefix cache: prompt tokens the server served from its cache (--cache-bust {target})")
    for col in ("turn", "requests reporting", "cached tokens (mean)", "prompt tokens (mean)", "share cached"):
        ct.add_column(col, justify="right")
    rows = [(str(s.turn), s.cache) for s in r.turns] + [("all", r.cache)]
    for name, c in rows:
        if c is None or not c.reported:
            continue
        ct.add_row(name, str(c.reported), _f(c.cached_tokens / c.reported), _f(c.prompt_tokens / c.reported),
                   _pct(c.share))  # fmt: skip
    return ct


def _latency_table(r: LoadgenReport) -> Table:
    lt = Table(title="latency (ms)")
    for col in ("", "mean", "p50", "p90", "p99", "max", "n"):
        lt.add_column(col, justify="right")
    lt.add_row(*_pct_row("end to end", r.latency_ms))
    if r.ttft_ms:
        lt.add_row(*_pct_row("time to first token", r.ttft_ms))
    if r.itl_ms:
        lt.add_row(*_pct_row("inter-token", r.itl_ms))
    if r.send_lateness_ms:
        lt.add_row(*_pct_row("send lateness", r.send_lateness_ms, 3))
    return lt


def _proxy_table(proxy: dict[str, dict[str, float]]) -> Table:
    pt = Table(title="the proxy's own counts during the run (from its /metrics)")
    pt.add_column("metric")
    pt.add_column("by label")
    for name, values in sorted(proxy.items()):
        pt.add_row(name, ", ".join(f"{k}={v:g}" for k, v in sorted(values.items())))
    return pt


def print_report(console: Console, r: LoadgenReport) -> None:
    console.print(_isl_table(r))
    if r.isl.budget_errors:
        console.print(
            f"[yellow]{r.isl.budget_errors} request(s) could not be budgeted exactly:[/] "
            + "; ".join(r.isl.budget_error_samples)
        )
    if len(r.turns) > 1:
        console.print(_turn_table(r))
    if r.cache is not None and r.cache.reported:  # vLLM reports it with --enable-prompt-tokens-details
        console.print(_cache_table(r))
    console.print(_latency_table(r))
    console.print(
        f"requests {r.requests} (ok {r.succeeded}, failed {r.failed}, warmup excluded {r.warmup_excluded}) in "
        f"{r.duration_s:.2f} s: {r.request_throughput:.1f} req/s, output {r.output_token_throughput:.1f} tok/s, "
        f"input {r.input_token_throughput:.1f} tok/s"
    )
    if r.errors:
        console.print("[red]errors:[/] " + ", ".join(f"{k}: {v}" for k, v in sorted(r.errors.items())))
    if r.proxy is not None:
        console.print(_proxy_table(r.proxy))
