"""wrk as the load client of `bench/proxy_overhead.py --client wrk`: a C client fast enough not to hide the
proxies' own cost (the Python client spends more CPU per request than the floor proxy does).

One wrk thread (`-t1`), closed loop: each of `-c` connections sends the next request when the previous answer
ended. Each block POSTs one fixed body (JSON or SSE answer) to one contender for a fixed time; contenders
alternate block by block, so background load on the shared machine hits each alike.

wrk 4.1 applies a coordinated-omission correction to its latency histogram before `done()` sees it
(stats.c `stats_correct`, called in wrk.c `main` with `expected = runtime_us / (requests / connections)`):
for every recorded latency n >= 2e it adds synthetic samples at n-e, n-2e, ... while > e. In a closed loop
nothing was omitted (no request was scheduled to start earlier), so those samples inflate the tail: a
c=32 p99 gains samples from every slow answer. The Lua `done()` below dumps the corrected histogram (every
1 us bin), and `uncorrect` inverts it exactly: C(x) = O(x) + sum_k O(x+ke) for x > e gives
O(x) = C(x) - C(x+e) (x > e), O(x) = C(x) otherwise. Synthetic bins below wrk's recorded minimum are not
listed by `latency(i)`, and the inversion never reads them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench._client import METRIC_NAMES, cpu_seconds, rss_mb
from bench._common import encode_body

LUA = r"""
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = assert(io.open(os.getenv("BENCH_WRK_BODY"), "rb"))
wrk.body = f:read("*a")
f:close()

function done(summary, latency, requests)
  local e = summary.errors
  local out = assert(io.open(os.getenv("BENCH_WRK_OUT"), "w"))
  out:write(string.format('{"requests": %d, "duration_us": %d, "errors": %d, "hist": [',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.status + e.timeout))
  for i = 1, #latency do
    local v, c = latency(i)
    out:write(string.format('%s[%d, %d]', i > 1 and ", " or "", v, c))
  end
  out:write("]}")
  out:close()
end
"""


def ensure_wrk() -> str:
    """wrk from Debian, installed when absent (the bench runs as root on the CI machine)."""
    found = shutil.which("wrk")
    if found:
        return found
    print("wrk not found: apt-get install -y wrk", file=sys.stderr)
    if subprocess.run(["apt-get", "install", "-y", "wrk"], capture_output=True, check=False).returncode:
        subprocess.run(["apt-get", "update"], capture_output=True, check=False)
        subprocess.run(["apt-get", "install", "-y", "wrk"], capture_output=True, check=True)
    found = shutil.which("wrk")
    if not found:
        raise RuntimeError("wrk could not be installed (apt-get install -y wrk)")
    return found


def phases(quick: bool) -> list[dict[str, Any]]:
    """c=1, 4, 32, JSON and SSE answers; seconds per block, reps rounds (contenders rotate per round)."""
    return [
        {"name": f"wrk-c{c}{'-stream' if stream else ''}", "concurrency": c, "stream": stream,
         "seconds": 1 if quick else 3, "reps": 1 if quick else 2}
        for stream in (False, True) for c in (1, 4, 32)
    ]  # fmt: skip


def uncorrect(hist: list[list[int]], requests: int, duration_us: int, connections: int) -> dict[int, int]:
    """wrk's latency histogram (us -> count) with its coordinated-omission samples removed (module doc)."""
    corrected = {int(v): int(c) for v, c in hist}
    per_conn = requests // connections
    if per_conn == 0:  # wrk corrects only when each connection completed at least one request
        return corrected
    e = duration_us // per_conn
    out = {x: c - (corrected.get(x + e, 0) if x > e else 0) for x, c in corrected.items()}
    return {x: c for x, c in out.items() if c > 0}


def _counters(url: str | None) -> dict[str, float]:
    if not url:
        return {}
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in METRIC_NAMES:
            out[name] = float(value)
    return out


def _block(wrk: str, url: str, conc: int, seconds: float, body: Path, tmp: Path) -> dict[str, Any]:
    out = tmp / "wrk.json"
    env = {"BENCH_WRK_BODY": str(body), "BENCH_WRK_OUT": str(out), "PATH": "/usr/bin:/bin"}
    argv = [wrk, "-t1", f"-c{conc}", f"-d{seconds}s", "--timeout", "30s", "-s", str(tmp / "bench.lua"),
            url + "/v1/chat/completions"]  # fmt: skip
    subprocess.run(argv, env=env, capture_output=True, check=True)
    raw = json.loads(out.read_text())
    hist = uncorrect(raw["hist"], raw["requests"], raw["duration_us"], conc)
    lat = [us / 1e6 for us, c in sorted(hist.items()) for _ in range(c)]
    return {"lat": lat, "late": [], "errors": raw["errors"], "wall": raw["duration_us"] / 1e6,
            "requests_reported": raw["requests"], "corrected_samples": sum(c for _, c in raw["hist"])}  # fmt: skip


def run(cfg: dict[str, Any], body: dict[str, Any], quick: bool) -> dict[str, Any]:
    """Blocks in bench/_client.py's shape (so proxy_overhead.summarize reads both clients' results)."""
    wrk = ensure_wrk()
    targets = list(cfg["targets"].items())
    upstream_pids = cfg.get("upstream_pids", [])
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "bench.lua").write_text(LUA)
        bodies = {s: tmp / f"body-{s}.json" for s in (False, True)}
        for stream, path in bodies.items():
            path.write_bytes(encode_body(body, stream))
        for _, url in targets:  # warm-up: connections, caches, lazy imports
            _block(wrk, url, 4, 1, bodies[False], tmp)
        for phase in phases(quick):
            for rep in range(phase["reps"]):
                k = rep % len(targets)
                for name, url in targets[k:] + targets[:k]:
                    pids, metrics = cfg["pids"].get(name, []), cfg["metrics"].get(name)
                    c0, u0, m0 = cpu_seconds(pids), cpu_seconds(upstream_pids), _counters(metrics)
                    main0 = cpu_seconds(pids, children=False)
                    r = _block(wrk, url, phase["concurrency"], phase["seconds"], bodies[phase["stream"]], tmp)
                    m1 = _counters(metrics)
                    r.update(phase=phase["name"], target=name, rep=rep, cpu=cpu_seconds(pids) - c0,
                             main_cpu=cpu_seconds(pids, children=False) - main0,
                             upstream_cpu=cpu_seconds(upstream_pids) - u0, rss_mb=rss_mb(pids),
                             counters={k2: m1.get(k2, 0.0) - m0.get(k2, 0.0) for k2 in m1})  # fmt: skip
                    results.append(r)
                    time.sleep(0.2)  # let the last answers' analyses land before the next contender
    return {"blocks": results}
