"""What a run leaves behind: --output (JSON), --records (JSONL), --csv, --html, and the goodput line."""

from __future__ import annotations

import orjson
from rich.console import Console

from loadgen.config import LoadgenConfig
from loadgen.report.csv_out import write_csv
from loadgen.report.goodput import attained
from loadgen.report.model import LoadgenReport
from loadgen.report.sweep import Run, SweepReport


def print_goodput(console: Console, r: LoadgenReport, attainment: float) -> None:
    g = r.goodput
    if g is None:
        return
    bounds = ", ".join(f"{k}<={v:g}" for k, v in g.slo.items())
    share = "-" if g.share is None else f"{g.share * 100:.2f}%"
    missed = ", ".join(f"{k} {v}" for k, v in g.missed.items() if v) or "none"
    verdict = "meets" if attained(g, attainment) else "misses"
    console.print(
        f"goodput ({bounds}): {g.good}/{g.requests} requests ({share}), {g.rate:.2f} req/s; missed: {missed}; "
        f"{verdict} the {attainment * 100:g}% attainment"
    )


def write_outputs(cfg: LoadgenConfig, runs: list[Run], sweep: SweepReport | None = None) -> None:
    if cfg.output:
        doc = sweep.model_dump_json(indent=2) if sweep is not None else runs[0][2].model_dump_json(indent=2)
        cfg.output.write_text(doc + "\n")
    if cfg.records:
        with cfg.records.open("wb") as f:
            for point, records, _ in runs:
                for rec in records:
                    line = orjson.dumps(rec)
                    if sweep is not None:  # the point first, so a line says which run it belongs to
                        line = b'{"point":' + orjson.dumps(point) + b"," + line[1:]
                    f.write(line + b"\n")
    if cfg.csv:
        write_csv(cfg.csv, ((p, rec) for p, records, _ in runs for rec in records), sweep=sweep is not None)
    if cfg.html:
        from loadgen.report.html import render_page  # only when asked for

        cfg.html.write_text(render_page(runs, sweep), encoding="utf-8")
