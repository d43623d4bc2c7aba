"""AIPerf 0.13 and `islwatch loadgen` side by side: does the server count what was asked, and which rates hold.

Both tools send to the same `islwatch proxy` in front of the same `islwatch emulate` (vLLM's counting path,
the shared tokenizer of each family), streaming chat, the same ISL and OSL. For each tokenizer:

- `aiperf`: `aiperf profile --prompt-input-tokens-mean ISL` (its default: ISL is the user text alone);
- `aiperf --apply-chat-template`: AIPerf's own compensation for the chat template's wrapping;
- `islwatch`: `islwatch loadgen --isl ISL` (the whole templated request).

Two shapes: one user turn, and one user turn with a shared system prompt of --system-prompt tokens (not on
Mistral v0.1, whose template refuses a system message). What is requested follows each tool's own docs:
islwatch's ISL is the whole templated request, system prompt included; AIPerf's ISL is the user prompt and its
`--shared-system-prompt-length` a system message on top, so AIPerf is asked for ISL + that length.
Per tool: the share of requests whose server count (usage.prompt_tokens, from each tool's per-request export)
equals what it was asked for, the mean |server - requested|, and the proxy's own mean server count over the
same requests (`islwatch_isl_tokens{kind="server"}` from its /metrics, an independent read of the usage).
Then a ladder of open-loop rates (constant arrivals, --seconds each) on the first tokenizer: a rate is held
when every request succeeded and the achieved send rate, (n - 1) / (last send - first send) from each tool's
per-request records (the same formula for both), is at least 95% of the offered rate.

Needs AIPerf in its own venv: `bash scripts/install_aiperf.sh` (cached under ~/.cache/islwatch/aiperf-0.13).
Usage: python -m bench.aiperf_vs_loadgen [--tokenizers a,b] [--isl 512] [--rates 25,50,100,200] [--quick]
Writes bench/results/aiperf_vs_loadgen-*.json and rewrites bench/LATEST.md (bench/report.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench._common import REPO, TEST_TOKENIZERS, machine, pct, write_result
from bench.proxy_overhead import free_port, start
from bench.report import HELD, aiperf_section, write_latest
from loadgen.send import proxy_metrics

AIPERF = Path(os.environ.get("ISLWATCH_CACHE", Path.home() / ".cache/islwatch")) / "aiperf-0.13/bin/aiperf"
TOOLS = ("aiperf", "aiperf --apply-chat-template", "islwatch")
NO_SYSTEM = {"mistral-7b-instruct-v0.1"}  # its template refuses a system message


def aiperf_binary() -> str:
    if AIPERF.exists():
        return str(AIPERF)
    out = subprocess.run(["bash", str(REPO / "scripts/install_aiperf.sh")], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"AIPerf could not be installed: {out.stderr[-800:]}")
    return out.stdout.strip().splitlines()[-1]


def run_aiperf(binary: str, url: str, tok: str, isl: int, osl: int, load: list[str], tmp: Path,
               template: bool, system: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    """AIPerf's requested ISL is the user prompt; a shared system prompt is a message of its own on top."""
    art = tmp / f"aiperf-{len(list(tmp.iterdir()))}"
    cmd = [binary, "profile", "--model", "default", "--url", url, "--endpoint-type", "chat", "--streaming",
           "--tokenizer", tok, "--prompt-input-tokens-mean", str(isl), "--prompt-input-tokens-stddev", "0",
           "--prompt-output-tokens-mean", str(osl), "--prompt-output-tokens-stddev", "0", "--random-seed", "1",
           "--output-artifact-dir", str(art), "--no-auto-plot", "--ui-type", "none", *load]  # fmt: skip
    if template:
        cmd.append("--apply-chat-template")
    if system:
        cmd += ["--shared-system-prompt-length", str(system)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=tmp)
    export = art / "profile_export.jsonl"
    if not export.exists():
        raise RuntimeError(f"aiperf failed ({done.returncode}): {(done.stdout + done.stderr)[-1500:]}")
    rows = []
    for line in export.read_text().splitlines():
        rec = json.loads(line)
        m, meta = rec.get("metrics", {}), rec.get("metadata", {})
        usage = m.get("usage_prompt_tokens", {}).get("value")
        rows.append({"server": usage, "target": isl + system, "sent_s": meta.get("request_start_ns", 0) / 1e9,
                     "ok": usage is not None and not rec.get("error"),
                     "latency_ms": m.get("request_latency", {}).get("value")})  # fmt: skip
    return rows


def run_islwatch(url: str, tok: str, isl: int, osl: int, load: list[str], tmp: Path) -> list[dict[str, Any]]:
    records = tmp / f"islwatch-{len(list(tmp.iterdir()))}.jsonl"
    cmd = [sys.executable, "-m", "proxy.cli", "--log-level", "WARNING", "loadgen", "--url", url, "--tokenizer",
           tok, "--isl", str(isl), "--osl", str(osl), "--streaming", "--records", str(records), *load]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO)
    if not records.exists():
        raise RuntimeError(f"islwatch loadgen failed ({done.returncode}): {done.stdout[-1500:]}")
    rows = []
    for line in records.read_text().splitlines():
        r = json.loads(line)
        rows.append({"server": r["server_prompt_tokens"], "target": r["target_isl"], "sent_s": r["sent_at"],
                     "ok": r["status"] == 200 and r["error"] is None, "latency_ms": r["latency_ms"]})  # fmt: skip
    return rows


def exactness(rows: list[dict[str, Any]]) -> dict[str, Any]:
    served = [r for r in rows if r["server"] is not None]
    errors = [abs(r["server"] - r["target"]) for r in served]
    return {"requests": len(rows), "served": len(served),
            "exact_share": sum(e == 0 for e in errors) / len(served) if served else None,
            "mean_abs_error": sum(errors) / len(errors) if errors else None,
            "mean_server": sum(r["server"] for r in served) / len(served) if served else None,
            "requested": sorted({r["target"] for r in rows})[0] if rows else None}  # fmt: skip


def rate_row(rows: list[dict[str, Any]], rate: float) -> dict[str, Any]:
    sent = sorted(r["sent_s"] for r in rows)
    span = sent[-1] - sent[0] if len(sent) > 1 else 0.0
    achieved = (len(sent) - 1) / span if span else 0.0
    failed = sum(not r["ok"] for r in rows)
    lat = [r["latency_ms"] for r in rows if r["latency_ms"] is not None]
    return {"rate": rate, "requests": len(rows), "failed": failed, "achieved_rps": achieved,
            "latency_p50_ms": pct(lat, 50), "latency_p99_ms": pct(lat, 99),
            "held": bool(rows) and failed == 0 and achieved >= HELD * rate}  # fmt: skip


def stack_for(stack: ExitStack, tok: str) -> tuple[str, str]:
    """An emulator and a proxy in front of it, both on `tok`: (proxy URL, proxy /metrics URL)."""
    emu, prx, adm = (f"127.0.0.1:{free_port()}" for _ in range(3))
    py = ["--log-level", "WARNING"]
    start(stack, "proxy.cli", [*py, "emulate", "--tokenizer", tok, "--listen", emu], f"http://{emu}/health")
    start(stack, "proxy.cli", [*py, "proxy", "--upstream", f"http://{emu}", "--listen", prx, "--admin", adm, "--tokenizer", tok],
          f"http://{adm}/readyz")  # fmt: skip
    return f"http://{prx}", f"http://{adm}/metrics"


def proxy_mean_server(metrics: str, before: proxy_metrics.Counts | None) -> float | None:
    after = proxy_metrics.scrape(metrics)
    if before is None or after is None:
        return None
    d = proxy_metrics.diff(before, after)
    n = d.get("islwatch_isl_tokens_count", {}).get("server", 0.0)
    return d.get("islwatch_isl_tokens_sum", {}).get("server", 0.0) / n if n else None


def measure(args: argparse.Namespace, binary: str, tmp: Path) -> dict[str, Any]:
    exact: list[dict[str, Any]] = []
    ladder: list[dict[str, Any]] = []
    closed = ["--concurrency", str(args.concurrency), "--request-count", str(args.requests)]
    for i, family in enumerate(args.tokenizers.split(",")):
        tok = str(TEST_TOKENIZERS / family)
        with ExitStack() as stack:
            url, metrics = stack_for(stack, tok)
            shapes = [("1 turn", 0)] + ([(f"system prompt {args.system_prompt}", args.system_prompt)]
                                        if args.system_prompt and family not in NO_SYSTEM else [])  # fmt: skip
            for shape, system in shapes:
                for tool in TOOLS:
                    before = proxy_metrics.scrape(metrics)
                    if tool == "islwatch":
                        extra = ["--shared-system-prompt-length", str(system)] if system else []
                        rows = run_islwatch(url, tok, args.isl, args.osl, closed + extra, tmp)
                    else:
                        rows = run_aiperf(
                            binary, url, tok, args.isl, args.osl, closed, tmp, "template" in tool, system
                        )
                    row = {"tokenizer": family, "shape": shape, "tool": tool, **exactness(rows)}
                    row["proxy_mean_server"] = proxy_mean_server(metrics, before)
                    exact.append(row)
                    print(json.dumps(row), flush=True)
            if i:
                continue
            for rate in [float(r) for r in args.rates.split(",")]:
                for tool in ("aiperf --apply-chat-template", "islwatch"):
                    if tool == "islwatch":
                        load = [
                            "--request-rate",
                            f"{rate:g}",
                            "--arrival",
                            "constant",
                            "--duration",
                            f"{args.seconds:g}",
                        ]
                        rows = run_islwatch(url, tok, args.isl, args.osl, load, tmp)
                    else:
                        load = ["--request-rate", f"{rate:g}", "--arrival-pattern", "constant",
                                "--benchmark-duration", f"{args.seconds:g}"]  # fmt: skip
                        rows = run_aiperf(binary, url, tok, args.isl, args.osl, load, tmp, True)
                    r = {"tokenizer": family, "tool": tool, **rate_row(rows, rate)}
                    ladder.append(r)
                    print(json.dumps(r), flush=True)
    return {"exactness": exact, "rates": ladder}


def highest_held(ladder: list[dict[str, Any]], tool: str) -> float | None:
    """The highest rate held with every lower rate of the ladder held too."""
    best = None
    for r in sorted((r for r in ladder if r["tool"] == tool), key=lambda r: r["rate"]):
        if not r["held"]:
            break
        best = r["rate"]
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizers", default="qwen2.5-instruct,llama-3-8b-instruct,mistral-7b-instruct-v0.1,"
                   "phi-3-mini-4k-instruct")  # fmt: skip
    p.add_argument("--isl", type=int, default=512)
    p.add_argument("--osl", type=int, default=16)
    p.add_argument("--requests", type=int, default=60)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument(
        "--system-prompt", type=int, default=100, help="tokens of the shared system prompt shape (0: none)"
    )
    p.add_argument("--rates", default="25,50,100,200")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--quick", action="store_true", help="one tokenizer, 20 requests, rates 25,50, 2 s")
    args = p.parse_args(argv)
    if args.quick:
        args.tokenizers, args.requests, args.rates, args.seconds = "qwen2.5-instruct", 20, "25,50", 2.0
    binary = aiperf_binary()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        data = measure(args, binary, Path(tmp))
    data.update(machine=machine(), aiperf_version=version, isl=args.isl, osl=args.osl, requests=args.requests,
                concurrency=args.concurrency, seconds=args.seconds)  # fmt: skip
    data["highest_held"] = {
        t: highest_held(data["rates"], t) for t in ("aiperf --apply-chat-template", "islwatch")
    }
    print(f"wrote {write_result('aiperf_vs_loadgen', data)}")
    print("\n".join(aiperf_section(data)))
    if not args.quick:
        print(f"wrote {write_latest()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
