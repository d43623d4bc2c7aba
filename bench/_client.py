"""The bench's load client, run in its own process: closed-loop (fixed concurrency) and open-loop (fixed
rate) phases against several targets, alternating targets block by block so each sees the same conditions.

Reads a JSON config (path in argv[1]), prints one JSON result on stdout. Per block it also samples the CPU
time and RSS of given process trees (from /proc) and the islwatch admin counters.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench._common import encode_body

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
# Analysed = worker analyses (seconds_count) + outcomes the memo reused (proxy/server/memo.py).
METRIC_NAMES = (
    "islwatch_analysis_dropped_total",
    "islwatch_analysis_seconds_count",
    "islwatch_analysis_reused_total",
)


def tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                todo.extend(int(c) for c in Path(f"/proc/{p}/task/{tid}/children").read_text().split())
        except OSError:
            continue
    return out


def cpu_seconds(pids: list[int], children: bool = True) -> float:
    total = 0
    for root in pids:
        for p in tree(root) if children else [root]:
            try:
                fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
            except OSError:
                continue
    return total / TICKS


def rss_mb(pids: list[int]) -> float:
    total = 0
    for root in pids:
        for p in tree(root):
            try:
                total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * PAGE
            except OSError:
                continue
    return total / 2**20


async def counters(session: aiohttp.ClientSession, url: str | None) -> dict[str, float]:
    if not url:
        return {}
    out = dict.fromkeys(METRIC_NAMES, 0.0)
    try:
        async with session.get(url) as r:
            text = await r.text()
    except aiohttp.ClientError:
        return out
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.split("{")[0] in out:
            out[name.split("{")[0]] += float(value)
    return out


class Target:
    def __init__(self, name: str, url: str, pids: list[int], metrics: str | None) -> None:
        self.name, self.url, self.pids, self.metrics = name, url + "/v1/chat/completions", pids, metrics
        self.sent = 0  # running body index: each target sends each body at most once (no warm caches)

    def next_index(self) -> int:
        self.sent += 1
        return self.sent - 1


async def one(
    session: aiohttp.ClientSession, url: str, body: bytes, stream: bool
) -> tuple[float, float, bool]:
    """(latency to the last byte, to the first byte, ok)."""
    t0 = time.perf_counter()
    first = 0.0
    try:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
            async for _ in r.content.iter_any():
                if not first:
                    first = time.perf_counter() - t0
            ok = r.status == 200
    except (TimeoutError, aiohttp.ClientError):
        ok = False
    return time.perf_counter() - t0, first, ok


async def closed_block(
    s: aiohttp.ClientSession, t: Target, bodies: list[bytes], conc: int, n: int, stream: bool
) -> dict:
    lat: list[float] = []
    ttfb: list[float] = []
    errors = 0
    counter = iter(range(n))

    async def worker() -> None:
        nonlocal errors
        for _ in counter:
            total, first, ok = await one(s, t.url, bodies[t.next_index() % len(bodies)], stream)
            if ok:
                lat.append(total)
                ttfb.append(first)
            else:
                errors += 1

    await asyncio.gather(*(worker() for _ in range(conc)))
    return {"lat": lat, "ttfb": ttfb, "errors": errors, "late": []}


async def open_block(
    s: aiohttp.ClientSession, t: Target, bodies: list[bytes], rate: float, seconds: float, stream: bool
) -> dict:
    n = int(rate * seconds)
    lat: list[float] = []
    late: list[float] = []
    errors = 0
    tasks: set[asyncio.Task] = set()

    async def send(i: int) -> None:
        nonlocal errors
        total, _, ok = await one(s, t.url, bodies[t.next_index() % len(bodies)], stream)
        if ok:
            lat.append(total)
        else:
            errors += 1

    t0 = time.perf_counter() + 0.01
    for i in range(n):
        due = t0 + i / rate
        now = time.perf_counter()
        if due > now:
            await asyncio.sleep(due - now)
        late.append(max(0.0, time.perf_counter() - due))
        task = asyncio.create_task(send(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=30)
    return {"lat": lat, "ttfb": [], "errors": errors + len(tasks), "late": late, "offered": n}


async def run(cfg: dict[str, Any]) -> dict[str, Any]:
    bodies = [orjson.loads(line) for line in Path(cfg["bodies"]).read_text().splitlines() if line]
    encoded = {stream: [encode_body(b, stream) for b in bodies] for stream in (False, True)}
    targets = [Target(n, u, cfg["pids"].get(n, []), cfg["metrics"].get(n)) for n, u in cfg["targets"].items()]
    upstream_pids = cfg.get("upstream_pids", [])
    results: list[dict[str, Any]] = []
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as s:
        for t in targets:  # warm-up: connections, caches, lazy imports
            await closed_block(s, t, encoded[False], 4, 40, False)
        for phase in cfg["phases"]:
            stream = phase["stream"]
            for rep in range(phase.get("reps", 1)):
                k = rep % len(targets)
                for t in targets[k:] + targets[:k]:
                    c0, u0, m0 = cpu_seconds(t.pids), cpu_seconds(upstream_pids), await counters(s, t.metrics)
                    main0 = cpu_seconds(t.pids, children=False)
                    w0 = time.perf_counter()
                    if phase["kind"] == "closed":
                        r = await closed_block(
                            s, t, encoded[stream], phase["concurrency"], phase["requests"], stream
                        )
                    else:
                        r = await open_block(s, t, encoded[stream], phase["rate"], phase["seconds"], stream)
                    wall = time.perf_counter() - w0
                    m1 = await counters(s, t.metrics)
                    r.update(
                        phase=phase["name"],
                        target=t.name,
                        rep=rep,
                        wall=wall,
                        cpu=cpu_seconds(t.pids) - c0,
                        main_cpu=cpu_seconds(t.pids, children=False) - main0,
                        upstream_cpu=cpu_seconds(upstream_pids) - u0,
                        rss_mb=rss_mb(t.pids),
                        counters={k2: m1.get(k2, 0.0) - m0.get(k2, 0.0) for k2 in m1},
                    )
                    results.append(r)
    return {"blocks": results}


def main() -> None:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        out = runner.run(run(cfg))
    sys.stdout.write(json.dumps(out))


if __name__ == "__main__":
    main()
