"""Running `islwatch proxy` as a subprocess (proxy/runtime/children.py) in front of a llama-server, and reading its /metrics.

The proxy is started through its public CLI (the way operators run it), so these tests exercise the same
wiring as production: config parsing, the analysis workers, the admin listener.
"""

from __future__ import annotations

import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from proxy.runtime import children
from proxy.runtime.children import free_port
from tests.eventually import eventually
from tests.interop.llama_server_proc import ServerFailed, log_tail
from tests.server.helpers import parse_metrics

# A guard against a hung start, not a timing assertion.
START_DEADLINE_SECONDS = 60.0
# The proxy analyses off the response path; a guard for the metric to appear, not a timing assertion.
ANALYSIS_DEADLINE_SECONDS = 30.0


@dataclass(frozen=True)
class Proxy:
    port: int
    admin_port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}/metrics"


@contextmanager
def running_proxy(
    upstream: str,
    tokenizer: str,
    log_path: Path,
    wait_for_upstream: bool = True,
    extra_args: tuple[str, ...] = (),
) -> Iterator[Proxy]:
    proxy = Proxy(free_port(), free_port(), log_path)
    cmd = ["proxy", "--upstream", upstream, "--tokenizer", tokenizer]
    cmd += ["--listen", f"127.0.0.1:{proxy.port}", "--admin", f"127.0.0.1:{proxy.admin_port}", *extra_args]
    proc = children.spawn(cmd, log_path).proc
    try:
        wait_ready(proc, proxy)
        yield proxy
    finally:
        children.stop(proc)


def wait_ready(proc: subprocess.Popen[bytes], proxy: Proxy) -> None:
    """Ready when /readyz says the analysis tokenizers are loaded (it does not look at the upstream)."""

    def probe() -> tuple[int | None, int]:  # (exit code once it exited, /readyz status)
        if proc.poll() is not None:
            return proc.returncode, 0
        # 503 while loading (urlopen raises it) or nothing listening yet: both count as not yet
        with urllib.request.urlopen(f"http://127.0.0.1:{proxy.admin_port}/readyz", timeout=5) as resp:
            return None, resp.status

    try:
        code, _ = eventually(
            probe,
            until=lambda seen: seen[0] is not None or seen[1] == 200,
            timeout=START_DEADLINE_SECONDS,
            what="islwatch proxy ready",
            interval=0.05,
        )
    except AssertionError as exc:
        raise ServerFailed(
            f"islwatch proxy not ready after {START_DEADLINE_SECONDS}s: {log_tail(proxy.log_path)}"
        ) from exc
    if code is not None:
        raise ServerFailed(f"islwatch proxy exited with {code}: {log_tail(proxy.log_path)}")


def scrape(proxy: Proxy) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics, keyed by (name, sorted labels)."""
    with urllib.request.urlopen(proxy.metrics_url, timeout=10) as resp:
        samples = parse_metrics(resp.read().decode())
    return {(name, tuple(sorted(labels))): value for (name, labels), value in samples.items()}


def match_counts(proxy: Proxy, endpoint: str) -> dict[str, float]:
    """islwatch_isl_match_total by result, for one endpoint (all models summed)."""
    counts: dict[str, float] = {}
    for (name, labels), value in scrape(proxy).items():
        lab = dict(labels)
        if name == "islwatch_isl_match_total" and lab.get("endpoint") == endpoint:
            counts[lab["result"]] = counts.get(lab["result"], 0.0) + value
    return counts


def wait_for_analysis(proxy: Proxy, endpoint: str, before: dict[str, float], n: int) -> dict[str, float]:
    """Poll until n more requests of the endpoint were analysed; returns the increase per result."""

    def increase() -> dict[str, float]:
        now = match_counts(proxy, endpoint)
        delta = {k: now.get(k, 0.0) - before.get(k, 0.0) for k in now}
        return {k: v for k, v in delta.items() if v}

    return eventually(
        increase,
        until=lambda delta: sum(delta.values()) >= n,
        timeout=ANALYSIS_DEADLINE_SECONDS,
        what=f"{n} more analysed {endpoint} request(s)",
        interval=0.02,
    )
