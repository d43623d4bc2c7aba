"""The proxy's added latency, throughput, CPU and memory, side by side with the floor proxy.

Processes: `islwatch emulate` (no artificial latency, a real tokenizer) as the fast upstream; the floor
(`bench/floor_proxy.py`); `islwatch proxy` with analysis on (every request analysed unless the pool drops
it); and the load client (`bench/_client.py`) in its own process. The client sends ~1,000-token chats
(`max_tokens` 16), alternating targets block by block: direct, floor, islwatch.

Reported per phase: p50/p99 latency per target, the latency each proxy adds over direct, and islwatch's added
latency as a ratio of the floor's (target <= 1.2x); max throughput at concurrency 32 (target >= 0.8x the
floor); proxy CPU seconds per 1,000 requests (analysis workers included); RSS; analysis drops.

`--client wrk` drives the same contenders with wrk instead (bench/wrk.py: one fixed body, JSON and SSE, c=1,
4, 32, wrk's coordinated-omission correction undone; results in proxy_overhead_wrk-latest.json). Targets
there (issue 14): added p50 and p99 <= 1.2x the floor's, req/s >= 0.9x, event-loop CPU <= 1.3x.

Usage: python -m bench.proxy_overhead [--tokenizer DIR] [--quick] [--no-islwatch] [--client python|wrk]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench import wrk as bench_wrk
from bench._client import tree
from bench._common import (
    TEST_TOKENIZERS,
    conversation,
    encode_body,
    machine,
    pct,
    words_for_tokens,
    write_result,
)
from proxy.core.count import count
from proxy.core.fast import FastEncoder
from proxy.core.tokenizer import load_tokenizer
from proxy.runtime import children
from proxy.runtime.children import free_port

TARGETS = ("direct", "floor", "islwatch", "variant")
WARMUP = 40  # requests per target before the phases (bench/_client.py)


def start(
    stack: ExitStack, module: str, args: list[str], ready: str, env: dict[str, str] | None = None
) -> children.Child:
    """`python -m MODULE ARGS...`, stopped when `stack` closes; returns once `ready` answers 200."""
    child = children.spawn(args, None, module=module, env=env)
    stack.callback(children.stop, child.proc, timeout=10)
    children.wait_ready(ready, [child], timeout=60)
    return child


def phases(quick: bool) -> list[dict[str, Any]]:
    """Small blocks, many alternations: background load on a shared machine hits every contender alike."""
    scale = 0.25 if quick else 1.0
    out: list[dict[str, Any]] = []
    for stream in (False, True):
        for conc, n, reps in ((1, 100, 6), (4, 200, 4), (32, 600, 3)):  # 3,200 requests per target
            out.append({"name": f"c{conc}{'-stream' if stream else ''}", "kind": "closed", "concurrency": conc,
                        "requests": max(20, int(n * scale)), "stream": stream,
                        "reps": 2 if quick else reps})  # fmt: skip
    for rate in (100, 500, 1000):
        out.append({"name": f"rate{rate}", "kind": "open", "rate": rate, "seconds": 1.0 if quick else 3,
                    "stream": False, "reps": 1})  # fmt: skip
    return out


def summarize(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    by: dict[tuple[str, str], dict[str, Any]] = {}
    for b in blocks:
        agg = by.setdefault((b["phase"], b["target"]), {"lat": [], "late": [], "errors": 0, "wall": 0.0,
                                                        "cpu": 0.0, "main_cpu": 0.0, "upstream_cpu": 0.0, "rss_mb": 0.0,
                                                        "dropped": 0.0, "analysed": 0.0, "offered": 0})  # fmt: skip
        agg["lat"] += b["lat"]
        agg["late"] += b["late"]
        agg["errors"] += b["errors"]
        agg["wall"] += b["wall"]
        agg["cpu"] += b["cpu"]
        agg["main_cpu"] += b["main_cpu"]
        agg["upstream_cpu"] += b["upstream_cpu"]
        agg["rss_mb"] = max(agg["rss_mb"], b["rss_mb"])
        agg["dropped"] += b["counters"].get("islwatch_analysis_dropped_total", 0.0)
        agg["analysed"] += b["counters"].get("islwatch_analysis_seconds_count", 0.0) + b["counters"].get(
            "islwatch_analysis_reused_total", 0.0
        )
        agg["offered"] += b.get("offered", 0)
    out: dict[str, Any] = {}
    for (phase, target), a in by.items():
        n = len(a["lat"])
        out.setdefault(phase, {})[target] = {
            "requests": n,
            "errors": a["errors"],
            "p50_ms": pct(a["lat"], 50) * 1e3,
            "p99_ms": pct(a["lat"], 99) * 1e3,
            "rps": n / a["wall"] if a["wall"] else 0.0,
            "offered": a["offered"],
            "send_late_p99_ms": pct(a["late"], 99) * 1e3 if a["late"] else None,
            "proxy_cpu_s_per_1000": a["cpu"] / n * 1000 if n else None,
            "proxy_main_cpu_s_per_1000": a["main_cpu"] / n * 1000 if n else None,  # without worker processes
            "upstream_cpu_s_per_1000": a["upstream_cpu"] / n * 1000 if n else None,
            "rss_mb": a["rss_mb"],
            "analysis_dropped": a["dropped"],
            "analysis_done": a["analysed"],
        }
    for targets in out.values():
        d = targets.get("direct")
        if not d:
            continue
        for name in TARGETS[1:]:
            t = targets.get(name)
            if t:
                t["added_p50_ms"] = t["p50_ms"] - d["p50_ms"]
                t["added_p99_ms"] = t["p99_ms"] - d["p99_ms"]
        f = targets.get("floor")
        for name in TARGETS[2:]:
            i = targets.get(name)
            if f and i:
                i["vs_floor"] = {
                    "added_p50": i["added_p50_ms"] / f["added_p50_ms"] if f["added_p50_ms"] > 0 else None,
                    "added_p99": i["added_p99_ms"] / f["added_p99_ms"] if f["added_p99_ms"] > 0 else None,
                    "rps": i["rps"] / f["rps"] if f["rps"] else None,
                }
    return out


def fmt(x: Any, spec: str = "7.2f") -> str:
    return format(x, spec) if isinstance(x, (int, float)) else format("-", ">" + spec.split(".")[0])


def print_table(summary: dict[str, Any]) -> None:
    print(f"{'phase':14} {'target':9} {'n':>5} {'err':>4} {'p50 ms':>7} {'p99 ms':>7} {'+p50':>7} {'+p99':>7} "
          f"{'rps':>7} {'cpu/1k':>7} {'main':>5} {'rss MB':>7} {'drop':>6} {'x floor +p50/+p99/rps':>24}")  # fmt: skip
    for phase, targets in summary.items():
        for name in TARGETS:
            t = targets.get(name)
            if not t:
                continue
            vs = t.get("vs_floor") or {}
            ratio = (
                " / ".join(fmt(vs.get(k), "4.2f") for k in ("added_p50", "added_p99", "rps")) if vs else ""
            )
            print(f"{phase:14} {name:9} {t['requests']:5d} {t['errors']:4d} {fmt(t['p50_ms'])} {fmt(t['p99_ms'])} "
                  f"{fmt(t.get('added_p50_ms'))} {fmt(t.get('added_p99_ms'))} {fmt(t['rps'], '7.0f')} "
                  f"{fmt(t['proxy_cpu_s_per_1000'] if name != 'direct' else None)} "
                  f"{fmt(t['proxy_main_cpu_s_per_1000'] if name != 'direct' else None, '5.2f')} "
                  f"{fmt(t['rss_mb'] if name != 'direct' else None, '7.0f')} {fmt(t['analysis_dropped'], '6.0f')} "
                  f"{ratio:>24}")  # fmt: skip


def verdicts(summary: dict[str, Any]) -> dict[str, Any]:
    """Each target of issue 7, met or not, from the measured ratios."""
    out: dict[str, Any] = {}
    for phase, targets in summary.items():
        vs = (targets.get("islwatch") or {}).get("vs_floor")
        if not vs or not phase.startswith(("c", "wrk-")):
            continue
        out[f"{phase} added p50 <= 1.2x floor"] = vs["added_p50"] is not None and vs["added_p50"] <= 1.2
        out[f"{phase} added p99 <= 1.2x floor"] = vs["added_p99"] is not None and vs["added_p99"] <= 1.2
        if phase.startswith("wrk-"):
            isl, floor = targets["islwatch"], targets["floor"]
            out[f"{phase} req/s >= 0.9x floor"] = vs["rps"] is not None and vs["rps"] >= 0.9
            main, floor_cpu = isl["proxy_main_cpu_s_per_1000"], floor["proxy_main_cpu_s_per_1000"]
            out[f"{phase} event-loop CPU <= 1.3x floor"] = bool(floor_cpu) and main <= 1.3 * floor_cpu
    c32 = summary.get("c32", {}).get("islwatch", {}).get("vs_floor")
    if c32:
        out["max throughput (c32) >= 0.8x floor"] = c32["rps"] is not None and c32["rps"] >= 0.8
    return out


def requests_per_target(plan: list[dict[str, Any]]) -> int:
    closed = sum(ph["requests"] * ph.get("reps", 1) for ph in plan if ph["kind"] == "closed")
    opened = sum(int(ph["rate"] * ph["seconds"]) * ph.get("reps", 1) for ph in plan if ph["kind"] == "open")
    return WARMUP + closed + opened


def post(url: str, data: bytes) -> tuple[bytes, str]:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read(), r.headers["Content-Type"]


def _placeholders(event: str) -> str:
    if not event.startswith("data: {"):
        return event
    obj = json.loads(event[6:])
    if obj.get("usage"):
        obj["usage"] = {**obj["usage"], "prompt_tokens": "__PROMPT__", "total_tokens": "__TOTAL__"}
    return "data: " + json.dumps(obj, separators=(",", ":")) + "\n\n"


def record(upstream: str, tok: Any, bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """Answer templates recorded from the emulator, and each body's prompt count (checked against it)."""
    url = upstream + "/v1/chat/completions"
    counter = FastEncoder(tok)  # equal to the emulator's count (tests/core/test_fast_encoder.py)
    prompt: dict[str, int] = {}
    for b in bodies:
        n = count(counter, "chat", b).templated
        for stream in (False, True):
            prompt[hashlib.sha256(encode_body(b, stream)).hexdigest()] = n
    for b in bodies[:5]:  # the emulator must agree, or the replayed usage would be wrong
        raw, _ = post(url, encode_body(b, False))
        server = json.loads(raw)["usage"]["prompt_tokens"]
        ours = prompt[hashlib.sha256(encode_body(b, False)).hexdigest()]
        if server != ours:
            raise RuntimeError(f"emulator counts {server}, the fast encoder {ours}: cannot replay exactly")
    raw, _ = post(url, encode_body(bodies[0], False))
    obj = json.loads(raw)
    obj["usage"] = {**obj["usage"], "prompt_tokens": "__PROMPT__", "total_tokens": "__TOTAL__"}
    raw_sse, _ = post(url, encode_body(bodies[0], True))
    events = [e + "\n\n" for e in raw_sse.decode().split("\n\n") if e]
    return {"json": json.dumps(obj, separators=(",", ":")), "sse": [_placeholders(e) for e in events],
            "prompt_tokens": prompt}  # fmt: skip


def renice_children(pid: int, niceness: int) -> int:
    """Lower the priority of a proxy's analysis worker processes (the proposal measured by --nice-variant)."""
    n = 0
    for child in tree(pid)[1:]:
        try:
            os.setpriority(os.PRIO_PROCESS, child, niceness)
            n += 1
        except OSError:
            continue
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_tok = TEST_TOKENIZERS / "llama-3-8b-instruct"
    p.add_argument(
        "--tokenizer", default=str(default_tok) if default_tok.is_dir() else "builtin:mistral-v0.1"
    )
    p.add_argument("--upstream", choices=("replay", "emulate"), default="replay",
                   help="replay: the emulator's recorded responses (default; see bench/replay_upstream.py)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="fewer requests, one rep (a smoke run)")
    p.add_argument("--no-islwatch", action="store_true", help="direct vs floor only")
    p.add_argument("--client", choices=("python", "wrk"), default="python",
                   help="load client: bench/_client.py (new prompts, open-loop phases) or wrk (bench/wrk.py)")  # fmt: skip
    p.add_argument("--variant-env", action="append", default=[], metavar="KEY=VALUE",
                   help="add a second islwatch ('variant') with this environment variable (repeatable)")  # fmt: skip
    p.add_argument(
        "--variant-nice", type=int, metavar="N", help="add a variant whose analysis workers run at nice N"
    )
    p.add_argument("--islwatch-arg", action="append", default=[], help="extra `islwatch proxy` argument")
    p.add_argument(
        "--variant-label",
        default="",
        metavar="TEXT",
        help="what the variant is, for the report (e.g. 'the code of commit 17cc65d')",
    )
    p.add_argument("--variant-rev", metavar="REV",
                   help="add a variant running the code of this git revision (exported with `git archive`)")  # fmt: skip
    p.add_argument("--variant-arg", action="append", default=[], metavar="ARG",
                   help="add a variant with this extra `islwatch proxy` argument (e.g. --variant-arg=--analysis-queue=1)")  # fmt: skip
    args = p.parse_args(argv)

    tok = load_tokenizer(args.tokenizer).tokenizer
    rng = random.Random(3)
    words = words_for_tokens(tok, 1000, 1)
    plan = phases(args.quick) if args.client == "python" else bench_wrk.phases(args.quick)
    # Every request carries a new prompt: analysis caches never make the measured traffic cheaper. (wrk sends
    # one fixed body, the issue's conditions: the caches hit, what is left is per-request work.)
    n_bodies = 5 if args.client == "wrk" else requests_per_target(plan) if args.upstream == "replay" else 200
    t_prep = time.perf_counter()
    bodies = [
        {"model": "bench", "max_tokens": 16, "messages": conversation(rng, 1, words)} for _ in range(n_bodies)
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    islwatch = not args.no_islwatch
    if islwatch:
        try:
            import proxy.cli.proxy  # noqa: F401
        except ImportError:
            print(
                "islwatch proxy (proxy.serve) not built yet: measuring direct vs floor only", file=sys.stderr
            )
            islwatch = False

    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        body_file = Path(tmp) / "bodies.jsonl"
        body_file.write_text("\n".join(json.dumps(b) for b in bodies))
        ports = {name: free_port() for name in ("up", "replay", "floor", "isl", "admin")}
        up = f"http://127.0.0.1:{ports['up']}"
        cli = ["--log-level", "WARNING"]
        emu = start(
            stack,
            "proxy.cli",
            [*cli, "emulate", "--tokenizer", args.tokenizer, "--listen", up[7:]],
            up + "/health",
            env,
        )
        if args.upstream == "replay":
            rec_file = Path(tmp) / "recording.json"
            rec_file.write_text(json.dumps(record(up, tok, bodies)))
            print(f"prepared {len(bodies)} prompts in {time.perf_counter() - t_prep:.0f}s", file=sys.stderr)
            up = f"http://127.0.0.1:{ports['replay']}"
            emu = start(stack, "bench.replay_upstream", ["--recording", str(rec_file),
                                "--listen", up[7:]], up + "/health", env)  # fmt: skip
        floor_url = f"http://127.0.0.1:{ports['floor']}"
        floor = start(stack, "bench.floor_proxy", ["--upstream", up, "--listen", floor_url[7:]],
                      floor_url + "/health", env)  # fmt: skip
        targets = {"direct": up, "floor": floor_url}
        pids: dict[str, list[int]] = {"floor": [floor.pid]}
        metrics: dict[str, str] = {}
        if islwatch:
            isl_url, admin = f"http://127.0.0.1:{ports['isl']}", f"http://127.0.0.1:{ports['admin']}"
            isl = start(stack, "proxy.cli", [*cli, "proxy", "--upstream", up, "--listen", isl_url[7:], "--admin", admin[7:],
                                "--tokenizer", args.tokenizer, *args.islwatch_arg], admin + "/readyz", env)  # fmt: skip
            targets["islwatch"], pids["islwatch"], metrics["islwatch"] = (
                isl_url,
                [isl.pid],
                admin + "/metrics",
            )
        if islwatch and (
            args.variant_env or args.variant_nice is not None or args.variant_arg or args.variant_rev
        ):
            # A second islwatch, changed only by environment, worker priority or arguments, or running the
            # code of another revision (the code before a change): measured A/B in the same run.
            v_url, v_admin = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
            v_env = {**env, **dict(kv.split("=", 1) for kv in args.variant_env)}
            if args.variant_rev:  # PYTHONSAFEPATH: `python -m` would put the working directory's code first
                v_env |= {
                    "PYTHONPATH": export_rev(args.variant_rev, Path(tmp) / "variant"),
                    "PYTHONSAFEPATH": "1",
                }
            v = start(stack, "proxy.cli", [*cli, "proxy", "--upstream", up, "--listen", v_url[7:], "--admin", v_admin[7:],
                              "--tokenizer", args.tokenizer, *args.islwatch_arg, *args.variant_arg], v_admin + "/readyz", v_env)  # fmt: skip
            if args.variant_nice is not None:
                print(
                    f"variant: {renice_children(v.pid, args.variant_nice)} worker processes reniced",
                    file=sys.stderr,
                )
            targets["variant"], pids["variant"], metrics["variant"] = v_url, [v.pid], v_admin + "/metrics"
        cfg = {"targets": targets, "pids": pids, "metrics": metrics, "bodies": str(body_file),
               "phases": plan, "upstream_pids": [emu.pid]}  # fmt: skip
        cfg_file = Path(tmp) / "client.json"
        cfg_file.write_text(json.dumps(cfg))
        t0 = time.perf_counter()
        if args.client == "wrk":
            blocks = bench_wrk.run(cfg, bodies[0], args.quick)["blocks"]
        else:
            blocks = _python_client(cfg_file, env)
        if blocks is None:
            return 1

    summary = summarize(blocks)
    print_table(summary)
    checks = verdicts(summary)
    for name, ok in checks.items():
        print(f"{'MET   ' if ok else 'MISSED'} {name}")
    result = "proxy_overhead" if args.client == "python" else "proxy_overhead_wrk"
    path = write_result(result, {
        "machine": machine(), "tokenizer": args.tokenizer, "seconds": time.perf_counter() - t0,
        "islwatch_args": args.islwatch_arg, "upstream": args.upstream, "summary": summary, "targets_met": checks,
        "phases": plan, "variant": {"env": args.variant_env, "nice": args.variant_nice, "args": args.variant_arg,
                    "rev": args.variant_rev, "label": args.variant_label},
        "client": args.client,
        "body_tokens": "~1000 (1-turn chat), max_tokens 16" + (", one fixed body" if args.client == "wrk" else ""),
    })  # fmt: skip
    print(f"wrote {path}")
    return 0


def export_rev(rev: str, into: Path) -> str:
    """The tree of git revision `rev` of this repository, written to `into` (the working tree untouched)."""
    into.mkdir(parents=True)
    repo = Path(__file__).resolve().parents[1]
    archive = subprocess.run(["git", "-C", str(repo), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return str(into)


def _python_client(cfg_file: Path, env: dict[str, str]) -> list[dict[str, Any]] | None:
    done = subprocess.run([sys.executable, "-m", "bench._client", str(cfg_file)], capture_output=True,
                          env=env, check=False)  # fmt: skip
    if done.returncode:
        print(done.stderr.decode()[-3000:], file=sys.stderr)
        return None
    blocks: list[dict[str, Any]] = json.loads(done.stdout)["blocks"]
    return blocks


if __name__ == "__main__":
    raise SystemExit(main())
