"""bench/LATEST.md from the latest results JSON of each benchmark (pure formatting, no measuring)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench._common import BENCH, RESULTS

LATEST = BENCH / "LATEST.md"
AIPERF_SECTION = "## AIPerf vs islwatch loadgen (`python -m bench.aiperf_vs_loadgen`)"
HELD = 0.95  # a rate is held: no failed request, and the achieved send rate >= this share of the offered
NOTES = [
    "## Reading these figures",
    "",
    "- Everything (client, upstream, proxies, analysis workers) shares the same 2 cores. Two things put "
    "islwatch's added latency above the floor's: its event-loop process does more CPU work per request than the "
    "floor (the bracketed CPU figure: relaying plus handing each request to analysis through a pipe and "
    "applying the outcome to the metrics), and a saturated analysis worker (one core at 100 %, at nice 10: "
    "`--analysis-nice`) competes with it for the CPU, which shows most in the concurrency-32 p99. Closed-loop "
    "phases of the Python client always saturate analysis (the drop column); the open-loop 100 and 500 req/s "
    "rows are unsaturated. With wrk's one fixed body, the memo (`--analysis-memo`) answers every analysis "
    "after the first, so the worker idles and the CPU columns are the event loop's own.",
    "- islwatch's CPU per request includes its analysis worker (~2 ms of CPU per new 1,000-token prompt on "
    "llama-3); the number in brackets is its main (event-loop) process alone, to compare with the floor.",
    "- RSS is summed over the process tree (main process + one analysis worker, each holding the tokenizer).",
    "- 1-turn analysis needs two encodes of the prompt text (the bare count and the templated count), hence "
    "~1.7-1.9x a raw encode even on the fast path; multi-turn traffic reuses earlier turns and is below 1.0x.",
    "",
]


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}-latest.json"
    return json.loads(path.read_text()) if path.exists() else None


def _f(x: Any, spec: str = ".2f") -> str:
    return format(x, spec) if isinstance(x, (int, float)) else "-"


def _machine(m: dict[str, Any]) -> str:
    return (f"{m.get('cpu')}, {m.get('cores')} cores, {m.get('memory_gb')} GB, {m.get('os')}, Python "
            f"{m.get('python')}, transformers {m.get('transformers')}, tokenizers {m.get('tokenizers')}; "
            f"1-min load average at the end: {_f(m.get('load_1m'))}")  # fmt: skip


def analysis_section(d: dict[str, Any]) -> list[str]:
    out = [
        "## Analysis cost (`python -m bench.analysis_cost`)",
        "",
        f"Machine: {_machine(d['machine'])}.",
        "",
        "Time per request as a ratio of a raw `tokenizers` encode of the same rendered text: the median over "
        "requests of the per-request wall-time ratio (CPU time summed over all requests in brackets). `ref` = `proxy.core.count.count_request`, `fast` = "
        "`proxy.core.fast.FastEncoder`. Target: <= 1.2x; multi-turn < 1.0x. The N-turn shapes send every turn "
        "with the whole history; the 40-turn one is the long-context agentic case (its last request "
        "past 100k tokens), and its last-request columns are the whole conversation counted at once.",
        "",
        "| tokenizer | shape | tokens (largest) | raw ms (median) | ref / raw | fast / raw | last request: tokens, "
        "fast / raw ms | reuse proven | mismatches |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for fam, f in d["families"].items():
        for shape, s in f["shapes"].items():
            rw, rc, lm = s.get("ratio_median", s["ratio_wall"]), s["ratio_cpu"], s.get("last_ms", {})
            ref_on = s.get("ref_requests", s["requests"])
            subset = f" (ref on {ref_on} of {s['requests']})" if ref_on < s["requests"] else ""
            out.append(
                f"| {fam} | {shape} | {s['tokens_max']} | {_f(s['ms_median']['raw'], '.3f')} | "
                f"{_f(rw['ref'])}x ({_f(rc['ref'])}x){subset} | {_f(rw['fast'])}x ({_f(rc['fast'])}x) | "
                f"{s.get('last_tokens', '-')}, {_f(lm.get('fast'), '.1f')} / {_f(lm.get('raw'), '.1f')} | "
                f"{f['reuse_proven']} | {s['mismatches']} |"
            )
    refused = [
        (fam, shape, why)
        for fam, f in d["families"].items()
        for shape, why in f.get("refused_shapes", {}).items()
    ]
    if refused:
        out += [
            "",
            "Not counted: shapes the family's chat template refuses (the server answers 400 to them too):",
        ]
        out += [f"- {fam}, {shape}: {why}" for fam, shape, why in refused]
    return [*out, ""]


def overhead_section(d: dict[str, Any]) -> list[str]:
    wrk = d.get("client") == "wrk"
    title = "## Proxy overhead, wrk client (`python -m bench.proxy_overhead --client wrk`)" if wrk else (
        "## Proxy overhead (`python -m bench.proxy_overhead`)")  # fmt: skip
    how = ("wrk 4.1, -t1, closed loop, one fixed body per block (JSON or SSE answer), its coordinated-omission "
           "correction undone (bench/wrk.py). Targets: added p50 and p99 <= 1.2x the floor's, req/s >= 0.9x, "
           "event-loop CPU <= 1.3x." if wrk else
           "islwatch / floor: target <= 1.2x for added p50 and p99, >= 0.8x for throughput.")  # fmt: skip
    out = [
        title,
        "",
        f"Machine: {_machine(d['machine'])}. Tokenizer: `{Path(d['tokenizer']).name}`; upstream: "
        f"{d.get('upstream', 'emulate')}; ~1,000-token chats, max_tokens 16.",
        "",
        "Added = p(through the proxy) - p(direct) in the same run, blocks alternating. " + how,
        "",
        "| phase | direct p50/p99 ms | floor +p50/+p99 ms | islwatch +p50/+p99 ms | islwatch/floor +p50, +p99, "
        "req/s | req/s floor / islwatch | CPU s per 1k req: floor / islwatch (its main process) | RSS MB floor / islwatch | "
        "analyses dropped |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for phase, t in d["summary"].items():
        di, fl, isl = t.get("direct", {}), t.get("floor", {}), t.get("islwatch", {})
        vs = isl.get("vs_floor") or {}
        out.append(
            f"| {phase} | {_f(di.get('p50_ms'))} / {_f(di.get('p99_ms'))} | "
            f"{_f(fl.get('added_p50_ms'))} / {_f(fl.get('added_p99_ms'))} | "
            f"{_f(isl.get('added_p50_ms'))} / {_f(isl.get('added_p99_ms'))} | "
            f"{_f(vs.get('added_p50'))}, {_f(vs.get('added_p99'))}, {_f(vs.get('rps'))} | "
            f"{_f(fl.get('rps'), '.0f')} / {_f(isl.get('rps'), '.0f')} | "
            f"{_f(fl.get('proxy_cpu_s_per_1000'))} / {_f(isl.get('proxy_cpu_s_per_1000'))} "
            f"({_f(isl.get('proxy_main_cpu_s_per_1000'))}) | "
            f"{_f(fl.get('rss_mb'), '.0f')} / {_f(isl.get('rss_mb'), '.0f')} | {_f(isl.get('analysis_dropped'), '.0f')} |"
        )
    out += [
        "",
        "Targets: " + ", ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in d["targets_met"].items()),
        "",
    ]
    return out + _variant_rows(d)


def _variant_rows(d: dict[str, Any]) -> list[str]:
    """A second islwatch measured in the same run (`--variant-*`): an A/B of a change, side by side."""
    v = d.get("variant") or {}
    if not any("variant" in t for t in d["summary"].values()):
        return []
    what = v.get("label") or ", ".join([*v.get("env", []), *v.get("args", [])]) or f"nice {v.get('nice')}"
    out = [
        f"Variant in the same run: {what}.",
        "",
        "| phase | islwatch / variant +p50 ms | islwatch / variant +p99 ms | x floor +p50: islwatch / variant | "
        "x floor +p99: islwatch / variant | islwatch / variant req/s (x floor) | event-loop CPU s per 1k: "
        "islwatch / variant | RSS MB islwatch / variant | errors islwatch / variant |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for phase, t in d["summary"].items():
        isl, var = t.get("islwatch", {}), t.get("variant", {})
        iv, vv = isl.get("vs_floor") or {}, var.get("vs_floor") or {}
        out.append(
            f"| {phase} | {_f(isl.get('added_p50_ms'))} / {_f(var.get('added_p50_ms'))} | "
            f"{_f(isl.get('added_p99_ms'))} / {_f(var.get('added_p99_ms'))} | "
            f"{_f(iv.get('added_p50'))} / {_f(vv.get('added_p50'))} | "
            f"{_f(iv.get('added_p99'))} / {_f(vv.get('added_p99'))} | "
            f"{_f(isl.get('rps'), '.0f')} / {_f(var.get('rps'), '.0f')} "
            f"({_f(iv.get('rps'))} / {_f(vv.get('rps'))}) | "
            f"{_f(isl.get('proxy_main_cpu_s_per_1000'))} / {_f(var.get('proxy_main_cpu_s_per_1000'))} | "
            f"{_f(isl.get('rss_mb'), '.0f')} / {_f(var.get('rss_mb'), '.0f')} | "
            f"{isl.get('errors', '-')} / {var.get('errors', '-')} |"
        )
    return [*out, ""]


def scrape_storm_section(d: dict[str, Any]) -> list[str]:
    out = [
        "## Scrape storm (`python -m bench.scrape_storm`)",
        "",
        f"Machine: {_machine(d['machine'])}. {d['scrapers']} scrapers in a closed loop on /metrics (OpenMetrics, "
        f"gzip) in a process of their own, against sequential chats (c1) to `islwatch emulate` "
        f"(`{d['tokenizer']}`), {d['reps']} rounds of {d['seconds']:g} s blocks, storm and quiet alternating. "
        "Target: the storm moves islwatch's chat p50 by < 10%.",
        "",
        "| contender | quiet p50 / p99 ms | storm p50 / p99 ms | storm / quiet p50 | storm / quiet p99 | scrapes/s answered |",
        "|---|---|---|---|---|---|",
    ]
    labels = {"islwatch": "islwatch", "variant": f"variant: the code at {d.get('variant_rev')}"}
    for name, c in d["summary"].items():
        q, s = c["quiet"], c["storm"]
        out.append(
            f"| {labels.get(name, name)} | {_f(q['p50_ms'])} / {_f(q['p99_ms'])} | {_f(s['p50_ms'])} / "
            f"{_f(s['p99_ms'])} | {_f(c['p50_ratio'])} | {_f(c['p99_ratio'])} | {_f(s['scrapes_per_s'], '.0f')} |"
        )
    return [*out, "", f"Target: {'met' if d.get('target_met') else 'MISSED'}.", ""]


def loadgen_section(d: dict[str, Any]) -> list[str]:
    out = [
        "## Loadgen capacity (`python -m bench.loadgen_capacity`)",
        "",
        f"Machine: {_machine(d['machine'])}. Static upstream; ISL {d['isl']}; {d['seconds']} s per rate; "
        "constant arrivals. Target: 2,000 req/s with p99 send lateness <= 2 ms.",
        "",
        "| workers | offered req/s | achieved | errors | lateness p50 / p99 / max ms | sends > 1 ms late | held |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in d["rows"]:
        if "error" in r:
            out.append(f"| {r['workers']} | {r['rate']} | failed | | | | |")
            continue
        out.append(
            f"| {r['workers']} | {r['rate']} | {_f(r['achieved_rps'], '.0f')} | {r['errors']} | "
            f"{_f(r['late_p50_ms'], '.3f')} / {_f(r['late_p99_ms'], '.3f')} / {_f(r['late_max_ms'], '.1f')} | "
            f"{_f(r['late_over_1ms'], '.1%')} | {r['held']} |"
        )
    if d.get("verdicts"):  # runs repeated per rate: the median run's p99 lateness decides
        out += ["", f"Per rate, {d['repeats']} runs: held when every run sent it without error and the "
                "median run's p99 lateness is <= 2 ms.", "",
                "| workers | offered req/s | median p99 lateness ms | runs held | held |", "|---|---|---|---|---|"]  # fmt: skip
        out += [f"| {v['workers']} | {v['rate']} | {_f(v['median_late_p99_ms'], '.3f')} | "
                f"{v['runs_held']} / {v['runs']} | {v['held']} |" for v in d["verdicts"]]  # fmt: skip
    out += ["", f"Highest held rate: {d['highest_held_rps']} req/s; aiperf: {d['aiperf']}.", ""]
    return out


def loadgen_agent_section(d: dict[str, Any]) -> list[str]:
    rates = ",".join(str(r) for r in sorted({r["rate"] for r in d["rows"]}))
    workers = ",".join(str(w) for w in sorted({r["workers"] for r in d["rows"]}))
    cmd = (f"python -m bench.loadgen_capacity --workload agent --tokenizer {Path(d['tokenizer']).name} --isl {d['isl']} "
           f"--round-isl {d['round_isl']} --agent-rounds {d['agent_rounds']} --rates {rates} --workers {workers} "
           f"--repeats {d['repeats']} --seconds {d['seconds']:g}"
           + (f" --variant-rev {d['variant_rev']}" if d.get("variant_rev") else ""))  # fmt: skip
    out = [
        "## Loadgen capacity, agent workload (`python -m bench.loadgen_capacity --workload agent`)",
        "",
        f"Machine: {_machine(d['machine'])}. `{cmd}` on {Path(d['tokenizer']).name}: first request ISL "
        f"{d['isl']}, each round +{d['round_isl']} tokens. Budgeting cost of one request, in-process, by rounds "
        "carried (each count renders the whole conversation):",
        "",
        "| request | rounds | target tokens | build p50 / mean ms | whole-request counts (mean) | exact |",
        "|---|---|---|---|---|---|",
    ]
    out += [f"| {c['request']} | {c['rounds']} | {c['target']} | {_f(c['build_ms_p50'], '.2f')} / "
            f"{_f(c['build_ms_mean'], '.2f')} | {_f(c['counts_mean'], '.1f')} | {c['exact']} / {c['conversations']} |"
            for c in d["agent_cost"]]  # fmt: skip
    variant = d.get("variant_rev")
    out += ["", f"Static upstream, open loop, constant arrivals, {d['seconds']} s per rate; each conversation is "
            "built whole before the clock starts (its follow-ups ignore the replies)."]  # fmt: skip
    if variant:
        out += [f"Variant in the same run, alternating with it at every rate: the loadgen of `{variant}`."]
    out += ["", "| code | workers | offered req/s | achieved | errors | exact | lateness p50 / p99 / max ms | held |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in d["rows"]:
        code = "variant" if r.get("code") == "variant" else "islwatch"
        if "error" in r:
            out.append(f"| {code} | {r['workers']} | {r['rate']} | failed | | | | |")
            continue
        out.append(
            f"| {code} | {r['workers']} | {r['rate']} | {_f(r['achieved_rps'], '.0f')} | {r['errors']} | "
            f"{r.get('exact', '-')} / {r['requests']} | {_f(r['late_p50_ms'], '.3f')} / "
            f"{_f(r['late_p99_ms'], '.3f')} / {_f(r['late_max_ms'], '.1f')} | {r['held']} |"
        )
    by_code = d.get("highest_held_by_code") or {"islwatch": d["highest_held_rps"]}
    held = ", ".join(f"{code}: {rate}" for code, rate in by_code.items())
    return [*out, "", f"Highest held rate (p99 lateness <= 2 ms, the whole rate sent): {held} req/s.", ""]


def aiperf_section(d: dict[str, Any]) -> list[str]:
    m = d["machine"]
    out = [AIPERF_SECTION, "",
           f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, AIPerf {d['aiperf_version']}; 1-min load "
           f"average at the end: {_f(m['load_1m'], '.2f')}. `islwatch emulate` behind `islwatch proxy`, streaming chat, "
           f"ISL {d['isl']}, OSL {d['osl']}; {d['requests']} requests per tool and tokenizer at concurrency "
           f"{d['concurrency']}.", "",
           "| tokenizer | shape | tool | requested | server count == requested | mean abs(server - requested) | "
           "mean server count (records / proxy) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in d["exactness"]:
        share = "-" if r["exact_share"] is None else f"{r['exact_share']:.1%} of {r['served']}"
        out.append(f"| {r['tokenizer']} | {r['shape']} | {r['tool']} | {r['requested']} | {share} | {_f(r['mean_abs_error'], '.2f')} | "
                   f"{_f(r['mean_server'], '.1f')} / {_f(r['proxy_mean_server'], '.1f')} |")  # fmt: skip
    out += ["", f"Open loop, constant arrivals, {d['seconds']:g} s per rate, on {d['exactness'][0]['tokenizer']}; "
            f"held = no failed request and achieved send rate >= {HELD:.0%} of offered.", "",
            "| tool | offered req/s | requests | failed | achieved req/s | latency p50 / p99 ms | held |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in d["rates"]:
        out.append(f"| {r['tool']} | {r['rate']:g} | {r['requests']} | {r['failed']} | {_f(r['achieved_rps'], '.1f')} | "
                   f"{_f(r['latency_p50_ms'], '.2f')} / {_f(r['latency_p99_ms'], '.2f')} | {r['held']} |")  # fmt: skip
    held = ", ".join(f"{t}: {_f(d['highest_held'][t], 'g')}" for t in d["highest_held"])
    return [*out, "", f"Highest rate held (every lower rate held too): {held} req/s.", ""]


SECTIONS = (
    ("analysis_cost", analysis_section),
    ("proxy_overhead", overhead_section),
    ("proxy_overhead_wrk", overhead_section),
    ("scrape_storm", scrape_storm_section),
    ("loadgen_capacity", loadgen_section),
    ("loadgen_capacity_agent", loadgen_agent_section),
    ("aiperf_vs_loadgen", aiperf_section),
)


def update_section(name: str) -> Path:
    """Replace (or add, before the notes) one benchmark's section of LATEST.md from its latest results, keeping
    every other section's text: results/ is not committed, so another machine's figures are not all here."""
    d = _load(name)
    if d is None:
        raise FileNotFoundError(f"no results for {name} in {RESULTS}")
    new = dict(SECTIONS)[name](d)
    old = LATEST.read_text().split("\n") if LATEST.exists() else []
    start = next((i for i, line in enumerate(old) if line == new[0]), None)
    if start is None:
        start = end = next((i for i, line in enumerate(old) if line == NOTES[0]), len(old))
    else:
        end = next((i for i in range(start + 1, len(old)) if old[i].startswith("## ")), len(old))
    LATEST.write_text("\n".join([*old[:start], *new, *old[end:]]))
    return LATEST


def write_latest() -> Path:
    lines = [
        "# Latest benchmark figures",
        "",
        "Written by `python -m bench` from bench/results/*-latest.json. Every ratio compares contenders "
        "measured in the same run, alternating. See docs/benchmarks/index.md for what each benchmark does.",
        "",
    ]
    for name, section in SECTIONS:
        d = _load(name)
        lines += section(d) if d else [f"## {name}", "", "No results yet.", ""]
    lines += NOTES
    LATEST.write_text("\n".join(lines))
    return LATEST


if __name__ == "__main__":
    import sys

    # python -m bench.report [NAME]: rewrite LATEST.md, or only NAME's section (e.g. proxy_overhead_wrk)
    print(update_section(sys.argv[1]) if len(sys.argv) > 1 else write_latest())
