"""A real Prometheus scraping a real `islwatch proxy` in front of `islwatch emulate --fault double-bos`, and a
second one in front of a real llama-server (`--metrics`) whose counters it scrapes (`--upstream-metrics-url`).

Every PromQL expression of the dashboard must parse and return data; every alert rule must parse and
evaluate without error inside Prometheus; the drift fault must show up as the alerts it should; the engine's
counters reach Prometheus beside the usage, equal to it.
Prometheus comes from Debian's package (scripts/install_prometheus.sh), llama-server from
scripts/build_llama_server.sh; the test skips only without them.
"""

from __future__ import annotations

import asyncio
import math
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.conftest import unavailable
from tests.eventually import eventually, eventually_async
from tests.ops.opslib import (
    ALERTS,
    INSTALL_HINT,
    alert_rules,
    dashboard,
    dashboard_queries,
    expand,
    find_tool,
)

pytestmark = pytest.mark.prometheus

SCRAPE = "1s"
# Stands in for Grafana's $__rate_interval: wide enough to hold both traffic waves and their scrapes.
RATE_INTERVAL = "2m"
DEADLINE = 90.0  # seconds any one readiness wait may take before the test fails (never an assertion on time)
WAVES = 2  # two waves with scrapes between them, so every counter has increased inside the rate window
PLAIN_MODEL = "plain"  # configured with a tokenizer without a chat template: the fallback path
BILLED_FAMILY = "qwen2.5-instruct"  # the llama-server model whose engine counters are scraped


@dataclass(frozen=True)
class Stack:
    proxy: str
    admin: str
    prometheus: str
    models: tuple[str, ...]
    billed: str  # the proxy in front of llama-server, its engine counters scraped
    billed_admin: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as fh:  # the child keeps its own handle
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def exited(procs: list[tuple[subprocess.Popen[bytes], Path]]) -> str | None:
    """The first process that is no longer running, with its log; None while all run."""
    for proc, log in procs:
        if proc.poll() is not None:
            return f"{proc.args[:4]} exited {proc.returncode}:\n{log.read_text()[-3000:]}"
    return None


async def wait_for(url: str, procs: list[tuple[subprocess.Popen[bytes], Path]], status: int = 200) -> None:
    """Poll `url` until it answers `status`; fail with the logs if a process dies or the deadline passes."""
    async with aiohttp.ClientSession() as session:

        async def probe() -> tuple[str | None, int]:
            died = exited(procs)
            if died is not None:
                return died, 0
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                return None, resp.status

        try:
            died, _ = await eventually_async(
                probe,
                until=lambda seen: seen[0] is not None or seen[1] == status,
                timeout=DEADLINE,
                what=f"{url} answering {status}",
                interval=0.2,
            )
        except AssertionError as exc:
            logs = "\n".join(log.read_text()[-2000:] for _, log in procs)
            pytest.fail(f"{exc}:\n{logs}")
    if died is not None:
        pytest.fail(died)


def plain_tokenizer(folder: Path) -> str:
    """A real tokenizer (tests/builders.py) saved without a chat template."""
    from tests.builders import build_tokenizer

    tok = build_tokenizer("chatml")
    tok.chat_template = None
    tok.save_pretrained(str(folder))
    return str(folder)


async def query(session: aiohttp.ClientSession, base: str, expr: str) -> dict[str, Any]:
    async with session.get(f"{base}/api/v1/query", params={"query": expr}) as resp:
        body = await resp.json()
    return body


async def scalar(session: aiohttp.ClientSession, base: str, expr: str) -> float:
    body = await query(session, base, expr)
    result = body.get("data", {}).get("result", [])
    return float(result[0]["value"][1]) if result else 0.0


async def wave(session: aiohttp.ClientSession, proxy: str) -> int:
    """One round of traffic; returns how many analysed (2xx, analysable) requests it sent."""
    chat = {"model": "mistral", "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    sent = 0
    for i in range(3):
        body = {**chat, "max_tokens": 4 + i}
        async with session.post(f"{proxy}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["usage"]["prompt_tokens"] > 0
        sent += 1
    stream = {**chat, "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
    async with session.post(f"{proxy}/v1/chat/completions", json=stream) as resp:
        assert resp.status == 200
        assert b"data: [DONE]" in await resp.read()
    sent += 1
    for prompt in ("<s>[INST] Hello there [/INST]", "Hello there"):  # the first already starts with BOS text
        body = {"model": "mistral", "prompt": prompt, "max_tokens": 3}
        async with session.post(f"{proxy}/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
        sent += 1
    body = {**chat, "model": PLAIN_MODEL, "max_tokens": 3}
    async with session.post(f"{proxy}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
    sent += 1
    # /v1/responses: the emulator's usage reports cached and reasoning tokens (0), chat's does not.
    async with session.post(f"{proxy}/v1/responses", json={"model": "mistral", "input": "Hi there"}) as resp:
        assert resp.status == 200, await resp.text()
    sent += 1
    async with session.post(
        f"{proxy}/v1/chat/completions", data=b"{not json", headers={"Content-Type": "application/json"}
    ) as resp:
        assert resp.status < 500  # relayed to the emulator, which refuses it; islwatch counts a bad request
    return sent


async def wait_analysed(session: aiohttp.ClientSession, prometheus: str, total: int) -> None:
    """Until Prometheus has scraped `total` analysed requests, then two scrapes more."""
    await eventually_async(
        lambda: scalar(session, prometheus, "sum(islwatch_isl_match_total)"),
        until=lambda seen: seen >= total,
        timeout=DEADLINE,
        what=f"Prometheus seeing {total} analysed requests",
        interval=0.25,
    )
    scraped = "max(timestamp(up{job='islwatch'}))"
    first = await scalar(session, prometheus, scraped)
    await eventually_async(
        lambda: scalar(session, prometheus, scraped),
        until=lambda last: last >= first + 2,
        timeout=DEADLINE,
        what="Prometheus scraping twice more",
        interval=0.25,
    )


async def billed_wave(session: aiohttp.ClientSession, proxy: str) -> int:
    """Chats through the proxy in front of llama-server; the repeats reuse its slot's cache."""
    chat = {"model": "m", "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    for _ in range(2):
        async with session.post(f"{proxy}/v1/chat/completions", json={**chat, "max_tokens": 3}) as resp:
            assert resp.status == 200, await resp.text()
    return 2


async def drive(stack: Stack) -> None:
    async with aiohttp.ClientSession() as session:
        total = 0
        for _ in range(WAVES):
            total += await wave(session, stack.proxy) + await billed_wave(session, stack.billed)
            await wait_analysed(session, stack.prometheus, total)


def llama_server_parts() -> tuple[str, Path]:
    """The llama-server binary and a tiny model (tests/interop); skips without them, as without Prometheus."""
    from tests.interop.llama_server_proc import BinaryUnavailable, find_binary, tiny_gguf

    gguf = tiny_gguf(BILLED_FAMILY)
    try:
        return find_binary(), gguf
    except BinaryUnavailable as exc:
        unavailable(str(exc))


def start_billed(tmp: Path, procs: list[tuple[subprocess.Popen[bytes], Path]]) -> tuple[str, str, str]:
    """llama-server with --metrics, and a proxy in front of it scraping them: (llama URL, proxy, admin)."""
    from tests.conftest import TEST_TOKENIZERS

    binary, gguf = llama_server_parts()
    llama_port, proxy_port, admin_port = (free_port() for _ in range(3))
    llama = f"http://127.0.0.1:{llama_port}"
    llama_log, proxy_log = tmp / "llama-server.log", tmp / "proxy-billed.log"
    cmd = [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(llama_port), "-np", "1", "-t", "1",
           "--no-webui", "--metrics"]  # fmt: skip
    procs.append((start(cmd, llama_log), llama_log))
    proxy = start(
        [sys.executable, "-m", "proxy.cli", "proxy", "--upstream", llama, "--listen", f"127.0.0.1:{proxy_port}",
         "--admin", f"127.0.0.1:{admin_port}", "--tokenizer", str(TEST_TOKENIZERS / BILLED_FAMILY),
         "--server-flavor", "llama.cpp", "--upstream-metrics-url", f"{llama}/metrics",
         "--upstream-metrics-interval-seconds", "0.5"],
        proxy_log,
    )  # fmt: skip
    procs.append((proxy, proxy_log))
    return llama, f"http://127.0.0.1:{proxy_port}", f"http://127.0.0.1:{admin_port}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus_bin = find_tool("prometheus")
    if prometheus_bin is None:
        unavailable(f"prometheus not found; {INSTALL_HINT}")
    llama_server_parts()  # skip before starting anything
    tmp = tmp_path_factory.mktemp("prometheus-live")
    emu_port, proxy_port, admin_port, prom_port = (free_port() for _ in range(4))
    cli = [sys.executable, "-m", "proxy.cli"]
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        emu_log = tmp / "emulate.log"
        emulator = start(
            [*cli, "emulate", "--listen", f"127.0.0.1:{emu_port}", "--tokenizer", "builtin:mistral-v0.1",
             "--fault", "double-bos"],
            emu_log,
        )  # fmt: skip
        procs.append((emulator, emu_log))
        proxy_log = tmp / "proxy.log"
        proxy = start(
            [*cli, "proxy", "--upstream", f"http://127.0.0.1:{emu_port}", "--listen", f"127.0.0.1:{proxy_port}",
             "--admin", f"127.0.0.1:{admin_port}", "--tokenizer", "builtin:mistral-v0.1",
             "--model-tokenizer", f"{PLAIN_MODEL}={plain_tokenizer(tmp / 'plain-tokenizer')}"],
            proxy_log,
        )  # fmt: skip
        procs.append((proxy, proxy_log))
        llama, billed, billed_admin = start_billed(tmp, procs)
        targets = [f"127.0.0.1:{admin_port}", billed_admin.removeprefix("http://")]
        config = {
            "global": {"scrape_interval": SCRAPE, "evaluation_interval": SCRAPE},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [{"job_name": "islwatch", "static_configs": [{"targets": targets}]}],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom_log = tmp / "prometheus.log"
        prometheus = start(
            [prometheus_bin, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
            prom_log,
        )  # fmt: skip
        procs.append((prometheus, prom_log))
        s = Stack(
            proxy=f"http://127.0.0.1:{proxy_port}",
            admin=f"http://127.0.0.1:{admin_port}",
            prometheus=f"http://127.0.0.1:{prom_port}",
            # With a --model-tokenizer map, unmapped names ("mistral") count as "other"; the unparsable
            # body as "none" (proxy/records.py). The proxy in front of llama-server has no map: "default".
            models=("other", PLAIN_MODEL, "none", "default"),
            billed=billed,
            billed_admin=billed_admin,
        )

        async def ready() -> None:
            await wait_for(f"http://127.0.0.1:{emu_port}/health", procs)
            await wait_for(f"{llama}/health", procs)
            await wait_for(f"{s.admin}/readyz", procs)
            await wait_for(f"{s.billed_admin}/readyz", procs)
            await wait_for(f"{s.prometheus}/-/ready", procs)
            await drive(s)

        asyncio.run(ready())
        yield s
    finally:
        for proc, _ in reversed(procs):
            stop(proc)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _get(url: str, **params: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(url, params=params) as resp:
        return resp.status, await resp.json(content_type=None)


def test_probe_paths_answer(stack: Stack) -> None:
    """The paths the Kubernetes probes and the PodMonitor use, on the real admin port."""
    assert run(_get(f"{stack.admin}/healthz"))[0] == 200
    assert run(_get(f"{stack.admin}/readyz"))[0] == 200
    status, targets = run(_get(f"{stack.prometheus}/api/v1/targets"))
    assert status == 200
    active = targets["data"]["activeTargets"]
    assert len(active) == 2  # the two proxies
    for target in active:
        assert target["health"] == "up" and target["scrapeUrl"].endswith("/metrics")


def test_model_variable_values(stack: Stack) -> None:
    """The dashboard's `model` variable: label_values(islwatch_requests_total, model)."""
    status, body = run(
        _get(f"{stack.prometheus}/api/v1/label/model/values", **{"match[]": "islwatch_requests_total"})
    )
    assert status == 200
    assert set(body["data"]) == set(stack.models)


def has_value(result: list[dict[str, Any]]) -> bool:
    return any(not math.isnan(float(r["value"][1])) for r in result)


QUERIES = dashboard_queries(dashboard())


# `All` is `.*`; a multi-value selection is interpolated as a regex alternation.
@pytest.mark.parametrize("model", [".*", f"(other|{PLAIN_MODEL})"], ids=["all-models", "two-models"])
@pytest.mark.parametrize("q", QUERIES, ids=[f"{q.panel}/{q.ref}" for q in QUERIES])
def test_dashboard_query_returns_data(stack: Stack, q: Any, model: str) -> None:
    expr = expand(q.expr, RATE_INTERVAL, model)
    status, body = run(_get(f"{stack.prometheus}/api/v1/query", query=expr))
    assert status == 200 and body["status"] == "success", body
    result = body["data"]["result"]
    assert result, f"no data for {q.panel}: {expr}"
    assert has_value(result), f"only NaN for {q.panel}: {expr} -> {result}"


RULES = alert_rules()


@pytest.mark.parametrize("rule", RULES, ids=[r["alert"] for r in RULES])
def test_alert_expression_evaluates(stack: Stack, rule: dict[str, Any]) -> None:
    status, body = run(_get(f"{stack.prometheus}/api/v1/query", query=rule["expr"]))
    assert status == 200 and body["status"] == "success", body


def rules_state(stack: Stack) -> dict[str, dict[str, Any]]:
    status, body = run(_get(f"{stack.prometheus}/api/v1/rules", type="alert"))
    assert status == 200
    return {r["name"]: r for g in body["data"]["groups"] for r in g["rules"]}


def test_prometheus_loaded_and_evaluated_every_rule(stack: Stack) -> None:
    state = rules_state(stack)
    assert set(state) == {r["alert"] for r in RULES}
    for name, rule in state.items():
        assert rule["health"] == "ok", f"{name}: {rule.get('lastError')}"


def alert_states(state: dict[str, dict[str, Any]], name: str) -> dict[str, str]:
    """model -> state of the alerts of one rule."""
    return {a["labels"]["model"]: a["state"] for a in state[name]["alerts"]}


def drift_alerts_seen(state: dict[str, dict[str, Any]]) -> bool:
    return (
        alert_states(state, "IslwatchDuplicateBOS").get("other") == "firing"
        and alert_states(state, "IslwatchTokenDrift").get("other") == "pending"
    )


def wait_drift_alerts(stack: Stack) -> dict[str, dict[str, Any]]:
    """double-bos: the duplicate-BOS alert fires at once; token drift is pending (it needs 10 minutes)."""

    def describe(state: dict[str, dict[str, Any]]) -> str:
        bos, drift = alert_states(state, "IslwatchDuplicateBOS"), alert_states(state, "IslwatchTokenDrift")
        return f"duplicate BOS: {bos}, token drift: {drift}"

    return eventually(
        lambda: rules_state(stack),
        until=drift_alerts_seen,
        timeout=DEADLINE,
        what="the duplicate-BOS alert firing and the token drift one pending",
        interval=0.5,
        describe=describe,
    )


def test_drift_fault_shows_up_as_alerts(stack: Stack) -> None:
    state = wait_drift_alerts(stack)
    assert alert_states(state, "IslwatchDuplicateBOS")["other"] == "firing"
    assert alert_states(state, "IslwatchTokenDrift")["other"] == "pending"


def test_no_proxy_down_or_upstream_error_alerts(stack: Stack) -> None:
    """Once the drift alerts show (so the rules were evaluated on the traffic), no other alert is active."""
    state = wait_drift_alerts(stack)
    assert state["IslwatchProxyDown"]["alerts"] == []
    assert state["IslwatchUpstreamErrors"]["alerts"] == []
    assert state["IslwatchEngineTokensUnaccounted"]["alerts"] == []  # llama-server's counters match usage


def test_engine_counters_reach_prometheus_equal_to_usage(stack: Stack) -> None:
    """Prometheus sees, for the proxy in front of llama-server, the engine's prompt tokens (cached ones added
    back), cached and generated tokens each equal to the usage summed through that proxy."""
    i = stack.billed_admin.removeprefix("http://")
    usage = {
        "prompt": f'sum(islwatch_isl_tokens_sum{{instance="{i}",kind="server"}})',
        "cached_prompt": f'sum(islwatch_cached_prompt_tokens_sum{{instance="{i}"}})',
        "generation": f'sum(islwatch_output_tokens_sum{{instance="{i}"}})',
    }

    async def both(kind: str) -> tuple[float, float]:
        engine = f'sum(islwatch_engine_tokens_total{{instance="{i}",kind="{kind}",engine="llama.cpp"}})'
        async with aiohttp.ClientSession() as session:
            return await scalar(session, stack.prometheus, engine), await scalar(
                session, stack.prometheus, usage[kind]
            )

    for kind in usage:
        engine, summed = eventually(
            lambda k=kind: run(both(k)),
            until=lambda pair: pair[0] > 0 and pair[0] == pair[1],
            timeout=DEADLINE,
            what=f"Prometheus seeing the engine's {kind} tokens equal to the usage's",
            interval=0.5,
            describe=lambda pair, k=kind: f"engine {k} {pair[0]}, usage {pair[1]}",
        )
        assert engine == summed
