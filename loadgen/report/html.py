"""`--html FILE`: one self-contained page (no script, no stylesheet or font fetched, works offline).

Charts are inline SVG drawn here (loadgen/report/svg.py) rather than a vendored chart library: the page needs no
JavaScript at all (it renders with scripts off, in a mail client or a CI artifact viewer), stays a few
hundred KB for thousands of requests, pins no third-party bundle to update and license, and what it draws
can be checked by reading the markup. Per chart: target vs achieved ISL (each request's client and server
count against its target, and the exact shares of client, server and the proxy's own match counter),
latency CDFs (TTFT, inter-token, end to end), throughput and errors over time; then the per-turn table.
A sweep adds its summary table and throughput/latency-vs-load charts before each point's section.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from loadgen.report.model import LoadgenReport, Percentiles
from loadgen.report.svg import Series, bar_chart, cdf_points, chart
from loadgen.report.sweep import Run, SweepReport
from loadgen.report.table import TURN_COLUMNS, turn_label, turn_rows
from loadgen.send.replies import Record

STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1180px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd}
.charts{display:flex;flex-wrap:wrap;gap:12px}table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}th{background:#f6f6f6}
td:first-child,th:first-child{text-align:left}.bad{color:#b00}.empty{color:#777}"""


def _f(v: float | None, digits: int = 1) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:,.{digits}f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.2f}%"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], name: str) -> str:
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table data-table="{name}"><tr>{th}</tr>{body}</table>'


def _measured(records: Sequence[Record]) -> list[Record]:
    return [r for r in records if not r.warmup]


def _errors(rs: Sequence[Record], field: str) -> list[tuple[float, float]]:
    """(request number in send order, achieved - target) for the requests with a count in `field`."""
    ordered = sorted(rs, key=lambda x: x.sent_at)
    return [
        (i + 1.0, float(v - x.target_isl))
        for i, x in enumerate(ordered)
        if (v := getattr(x, field)) is not None
    ]


def isl_charts(r: LoadgenReport, records: Sequence[Record]) -> str:
    rs = _measured(records)
    targets = sorted({float(x.target_isl) for x in rs})
    if len(targets) > 1:
        client = [(float(x.target_isl), float(x.client_isl)) for x in rs if x.client_isl is not None]
        server = [(float(x.target_isl), float(v)) for x in rs if (v := x.server_prompt_tokens) is not None]
        diagonal = [(targets[0], targets[0]), (targets[-1], targets[-1])]
        series = [Series("target = achieved", diagonal, "line", "#bbb", dashed=True),
                  Series("client templated", client, "rings"), Series("server usage", server, "dots")]  # fmt: skip
        scatter = chart("isl-scatter", "ISL: achieved vs target, per request", "target ISL (tokens)",
                        "achieved (tokens)", series, y_from_zero=False)  # fmt: skip
    else:  # one target for every request: its error per request says more than a single dot
        series = [Series("client templated", _errors(rs, "client_isl"), "rings"),
                  Series("server usage", _errors(rs, "server_prompt_tokens"), "dots")]  # fmt: skip
        scatter = chart("isl-scatter", "ISL: achieved - target, per request", "request (in send order)",
                        "achieved - target (tokens)", series, y_from_zero=False)  # fmt: skip
    shares = [("client", r.isl.client_exact_rate), ("server", r.isl.server_exact_rate)]
    if r.proxy is not None:
        match = r.proxy.get("islwatch_isl_match_total", {})
        total = sum(match.values())
        shares.append(("proxy", match.get("exact", 0) / total if total else None))
    bars = [(f"{n} exact", None if v is None else v * 100) for n, v in shares]
    exact = bar_chart("isl-exact", "requests whose count equals the target", bars, "%", 100.0)
    return scatter + exact


def latency_charts(records: Sequence[Record]) -> str:
    ok = [r for r in _measured(records) if r.status == 200 and r.error is None]
    out = []
    for name, label, field in (("cdf-ttft", "time to first token", "ttft_ms"), ("cdf-itl", "inter-token latency",
                               "itl_ms"), ("cdf-e2e", "end-to-end latency", "latency_ms")):  # fmt: skip
        values = [v for r in ok if (v := getattr(r, field)) is not None]
        out.append(
            chart(
                name,
                f"{label}: CDF",
                f"{label} (ms)",
                "share of requests",
                [Series(label, cdf_points(values), "step")],
            )
        )
    return "".join(out)


def _bin_width(duration: float) -> float:
    raw = max(duration / 40, 1e-3)
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def timeline_chart(records: Sequence[Record]) -> str:
    rs = [r for r in _measured(records) if r.latency_ms is not None or r.error]
    if not rs:
        return chart("timeline", "throughput and errors over time", "s", "req/s", [])
    t0 = min(r.sent_at for r in rs)
    ends = [(r.sent_at + (r.latency_ms or 0) / 1000 - t0, r.status == 200 and r.error is None) for r in rs]
    width = _bin_width(max(t for t, _ in ends) or 1e-3)
    bins = int(max(t for t, _ in ends) // width) + 1
    ok, bad = [0] * bins, [0] * bins
    for t, good in ends:
        (ok if good else bad)[min(int(t // width), bins - 1)] += 1
    mid = [(i + 0.5) * width for i in range(bins)]
    series = [Series("completed", [(m, c / width) for m, c in zip(mid, ok, strict=True)], "line")]
    if any(bad):  # the error bars, only where there were errors
        series.append(
            Series("errors", [(m, c / width) for m, c in zip(mid, bad, strict=True)], "bars", "#d62728")
        )
    title = f"completions and errors per second ({width:g} s bins)"
    return chart("timeline", title, "time since the first send (s)", "req/s", series)


def _pct_row(name: str, p: Percentiles | None) -> list[str]:
    if p is None:
        return [name, "-", "-", "-", "-", "-", "0"]
    return [name, _f(p.mean, 2), _f(p.p50, 2), _f(p.p90, 2), _f(p.p99, 2), _f(p.max, 2), str(p.n)]


def run_section(r: LoadgenReport, records: Sequence[Record], title: str) -> str:
    isl = r.isl
    summary = _table(
        ["", "mean", "exact", "rate", "p50 err", "p99 err", "max err"],
        [["target", _f(isl.target_mean), "", "", "", "", ""]]
        + [[name, _f(mean), f"{hit}/{n}", _pct(rate), _f(e.p50 if e else None, 0), _f(e.p99 if e else None, 0),
            _f(e.max if e else None, 0)] for name, mean, hit, n, rate, e in (
            ("client templated", isl.client_mean, isl.client_exact, isl.requests, isl.client_exact_rate, isl.client_error),
            ("server usage", isl.server_mean, isl.server_exact, isl.server_reported, isl.server_exact_rate, isl.server_error))],
        "isl",
    )  # fmt: skip
    turns = _table([turn_label(r), *TURN_COLUMNS], turn_rows(r), "turns")  # target vs achieved per turn
    lat = _table(
        ["", "mean", "p50", "p90", "p99", "max", "n"],
        [_pct_row("end to end", r.latency_ms), _pct_row("time to first token", r.ttft_ms),
         _pct_row("inter-token", r.itl_ms), _pct_row("send lateness", r.send_lateness_ms)],
        "latency",
    )  # fmt: skip
    line = (f"{r.requests} requests (ok {r.succeeded}, failed {r.failed}) in {r.duration_s:.2f} s: "
            f"{r.request_throughput:.1f} req/s, output {r.output_token_throughput:.1f} tok/s")  # fmt: skip
    errors = "".join(f'<p class="bad">{escape(k)}: {v}</p>' for k, v in sorted(r.errors.items()))
    g = r.goodput
    good = "" if g is None else (
        f"<p>goodput ({escape(', '.join(f'{k}<={v:g}' for k, v in g.slo.items()))}): {g.good}/{g.requests} "
        f"requests ({_pct(g.share)}), {g.rate:.2f} req/s</p>")  # fmt: skip
    return (
        f'<section data-run="{escape(r.run_id)}"><h2>{escape(title)}</h2><p>{escape(line)}</p>{errors}{good}'
        f'<div class="charts">{isl_charts(r, records)}{latency_charts(records)}{timeline_chart(records)}</div>'
        f"<h3>ISL: target vs achieved</h3>{summary}<h3>per {turn_label(r)}</h3>{turns}<h3>latency (ms)</h3>{lat}</section>"
    )


def sweep_section(s: SweepReport) -> str:
    pts = s.points
    axis = s.axis.replace("_", " ")
    thr = [Series("achieved req/s", [(p.value, p.request_throughput) for p in pts], "line")]
    if s.slo is not None:
        thr.append(Series("goodput req/s", [(p.value, p.goodput_rate or 0.0) for p in pts], "line"))
    lat = [Series(f"{n} p{q}", [(p.value, v) for p in pts if (v := getattr(p, f"{k}_p{q}")) is not None], "line",
                  dashed=q == 99) for n, k in (("TTFT", "ttft"), ("E2E", "e2e")) for q in (50, 99)]  # fmt: skip
    rows = [[f"{p.value:g}", f"{p.succeeded}/{p.requests}", _f(p.request_throughput), _pct(p.server_exact_rate),
             _f(p.ttft_p99), _f(p.e2e_p99), _pct(p.goodput_share), "-" if p.meets_slo is None else
             ("yes" if p.meets_slo else "no")] for p in pts]  # fmt: skip
    knee = (
        "no --slo: no knee" if s.slo is None else f"knee: {s.knee:g}" if s.knee is not None else "knee: none"
    )
    return (
        f'<section data-sweep="{escape(s.axis)}"><h2>sweep over {escape(axis)}</h2><p>{escape(knee)}</p>'
        + _table(
            [axis, "ok/sent", "req/s", "server exact", "TTFT p99", "E2E p99", "goodput", "meets SLO"],
            rows,
            "sweep",
        )
        + '<div class="charts">'
        + chart("sweep-throughput", "throughput vs load", axis, "req/s", thr)
        + chart("sweep-latency", "latency vs load", axis, "ms", lat)
        + "</div></section>"
    )


def render_page(runs: Sequence[Run], sweep: SweepReport | None = None) -> str:
    first = runs[0][2]
    cfg = first.config
    what = cfg.get("trace") or cfg.get("dataset") or f"synthetic ISL {cfg.get('isl')}"
    title = f"islwatch loadgen: {what} against {cfg.get('url')} ({cfg.get('endpoint')})"
    body = [f"<h1>{escape(title)}</h1>", f"<p>tokenizer {escape(str(first.tokenizer.get('name', '')))}; "
            f"run {escape(first.run_id)}</p>"]  # fmt: skip
    if sweep is not None:
        body.append(sweep_section(sweep))
    for value, records, report in runs:
        label = (
            "the run" if value is None else f"{sweep.axis.replace('_', ' ') if sweep else 'point'} {value:g}"
        )
        body.append(run_section(report, records, label))
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n"
    )
