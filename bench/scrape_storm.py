"""What a storm of /metrics scrapes costs chat traffic, side by side: islwatch as it is, and (with
`--variant-rev`) the code of another revision, each with and without a storm, blocks alternating.

Processes: `islwatch emulate` as the upstream; each contender `islwatch proxy` with analysis on (so its
registry holds the histograms a real one does); the storm, `--scrapers` clients in a process of their own,
each sending the next GET /metrics (OpenMetrics, gzip, as Prometheus asks) as soon as the last is answered;
the chat client, sequential chats (c1) from this process. Reported per contender: chat p50 and p99 with the
storm and without, their ratio (target: the storm moves p50 by < 10%), and the scrapes answered per second.

Usage: python -m bench.scrape_storm [--scrapers 200] [--seconds 4] [--reps 3] [--variant-rev REV]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp

from bench._common import machine, pct, write_result
from bench.proxy_overhead import export_rev, start
from proxy.runtime.children import free_port

CHAT = {"model": "demo", "max_tokens": 8, "messages": [{"role": "user", "content": "Say hello. " * 60}]}
SCRAPE_HEADERS = {"Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
                  "Accept-Encoding": "gzip"}  # fmt: skip


async def storm(url: str, scrapers: int) -> None:
    """The storm process: scrapers in a closed loop until killed; prints the scrapes answered per second."""
    done = 0
    t0 = time.perf_counter()

    async def one(s: aiohttp.ClientSession) -> None:
        nonlocal done
        while True:
            try:
                async with s.get(url, headers=SCRAPE_HEADERS) as resp:
                    await resp.read()
                    done += resp.status == 200
            except aiohttp.ClientError:
                await asyncio.sleep(0.01)

    async def report() -> None:
        while True:
            await asyncio.sleep(1.0)
            print(f"{done / (time.perf_counter() - t0):.1f}", flush=True)

    connector = aiohttp.TCPConnector(limit=scrapers)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as s:
        await asyncio.gather(report(), *(one(s) for _ in range(scrapers)))


async def chats(url: str, seconds: float) -> list[float]:
    latencies: list[float] = []
    async with aiohttp.ClientSession() as s:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t = time.perf_counter()
            async with s.post(url + "/v1/chat/completions", json=CHAT) as resp:
                await resp.read()
                assert resp.status == 200, resp.status
            latencies.append(time.perf_counter() - t)
    return latencies


def block(target: str, admin: str, scrapers: int, seconds: float, env: dict[str, str]) -> dict[str, Any]:
    storm_proc = None
    if scrapers:
        storm_proc = subprocess.Popen(
            [sys.executable, "-m", "bench.scrape_storm", "--storm", admin + "/metrics", "--scrapers", str(scrapers)],
            stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert storm_proc.stdout is not None
        storm_proc.stdout.readline()  # a second into the storm
    try:
        lat = asyncio.run(chats(target, seconds))
    finally:
        rate = None
        if storm_proc is not None:
            assert storm_proc.stdout is not None
            storm_proc.kill()
            reports = storm_proc.stdout.read().split()  # one a second: the last covers the whole block
            storm_proc.wait()
            rate = float(reports[-1]) if reports else 0.0
    return {"lat": lat, "scrapes_per_s": rate}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scrapers", type=int, default=200)
    p.add_argument("--seconds", type=float, default=4.0, help="chat time per block")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--variant-rev", metavar="REV", help="also measure the code of this git revision")
    p.add_argument("--tokenizer", default="builtin:mistral-v0.1")
    p.add_argument("--storm", metavar="URL", help=argparse.SUPPRESS)  # the storm process itself
    args = p.parse_args(argv)
    if args.storm:
        asyncio.run(storm(args.storm, args.scrapers))
        return 0

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cli = ["--log-level", "WARNING"]
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        up = f"http://127.0.0.1:{free_port()}"
        start(stack, "proxy.cli", [*cli, "emulate", "--tokenizer", args.tokenizer, "--model", "demo",
                                   "--listen", up[7:]], up + "/health", env)  # fmt: skip
        contenders: dict[str, tuple[str, str]] = {}
        roots = {
            "islwatch": None,
            "variant": export_rev(args.variant_rev, Path(tmp) / "v") if args.variant_rev else None,
        }
        for name, root in roots.items():
            if name == "variant" and root is None:
                continue
            url, admin = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
            c_env = env if root is None else {**env, "PYTHONPATH": root, "PYTHONSAFEPATH": "1"}
            start(stack, "proxy.cli", [*cli, "proxy", "--upstream", up, "--listen", url[7:], "--admin", admin[7:],
                                       "--tokenizer", args.tokenizer], admin + "/readyz", c_env)  # fmt: skip
            asyncio.run(chats(url, 1.0))  # warm-up: pools, memo, histograms with samples
            contenders[name] = (url, admin)
        blocks = []
        for rep in range(args.reps):
            for name, (url, admin) in contenders.items():
                for scrapers in (0, args.scrapers) if rep % 2 == 0 else (args.scrapers, 0):
                    b = block(url, admin, scrapers, args.seconds, env)
                    blocks.append({"target": name, "storm": bool(scrapers), **b})
                    print(f"{name:9} storm={bool(scrapers)!s:5} n={len(b['lat']):5d} "
                          f"p50={pct(b['lat'], 50) * 1e3:7.2f} ms scrapes/s={b['scrapes_per_s']}", file=sys.stderr)  # fmt: skip
    summary: dict[str, Any] = {}
    for name in contenders:
        cell = {}
        for storm_on in (False, True):
            lat = [x for b in blocks if b["target"] == name and b["storm"] == storm_on for x in b["lat"]]
            rates = [b["scrapes_per_s"] for b in blocks if b["target"] == name and b["storm"] == storm_on]
            cell["storm" if storm_on else "quiet"] = {
                "requests": len(lat), "p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3,
                "scrapes_per_s": sum(r for r in rates if r) / len(rates) if storm_on else None,
            }  # fmt: skip
        cell["p50_ratio"] = cell["storm"]["p50_ms"] / cell["quiet"]["p50_ms"]
        cell["p99_ratio"] = cell["storm"]["p99_ms"] / cell["quiet"]["p99_ms"]
        summary[name] = cell
        print(f"{name:9} quiet p50 {cell['quiet']['p50_ms']:.2f} ms, storm p50 {cell['storm']['p50_ms']:.2f} ms "
              f"({cell['p50_ratio']:.2f}x), p99 {cell['quiet']['p99_ms']:.2f} -> {cell['storm']['p99_ms']:.2f} ms, "
              f"{cell['storm']['scrapes_per_s']:.0f} scrapes/s")  # fmt: skip
    path = write_result("scrape_storm", {
        "machine": machine(), "scrapers": args.scrapers, "seconds": args.seconds, "reps": args.reps,
        "variant_rev": args.variant_rev, "tokenizer": args.tokenizer, "summary": summary,
        "target_met": summary["islwatch"]["p50_ratio"] < 1.10,
    })  # fmt: skip
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
