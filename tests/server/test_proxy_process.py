"""The real `islwatch proxy` command (worker processes, the default): readiness, analysis in another
process, SIGHUP reload that detects a changed template, graceful SIGTERM. And the bounded queue: a full
queue drops analyses (counted) instead of waiting."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from proxy.emulator.app import EmulatorConfig, build_emulator_app
from proxy.runtime import children
from proxy.runtime.children import free_port
from proxy.server.analyzer import AnalysisSpec
from proxy.server.metrics import build_metrics
from proxy.server.pool import AnalysisPool
from proxy.server.records import AnalysisJob
from tests.builders import save_tokenizer
from tests.conftest import load_builtin
from tests.eventually import eventually_async
from tests.server.helpers import Background, fetch_metrics, serve_app, value, wait_metrics

CHAT = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hello there"}]}


@pytest.fixture(scope="module")
def emulator() -> Iterator[str]:
    bg = Background()
    url = bg.enter(serve_app(build_emulator_app(EmulatorConfig(), tokenizer=load_builtin())))
    yield url
    bg.close()


@dataclass
class CliProxy:
    proc: subprocess.Popen[bytes]
    url: str
    admin: str
    folder: Path  # the `built` model's tokenizer folder
    log: Path  # the proxy's stdout and stderr

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


async def _wait_ready(session: aiohttp.ClientSession, proxy: CliProxy) -> None:
    async def probe() -> tuple[int | None, int]:
        if proxy.proc.poll() is not None:
            return proxy.proc.returncode, 0
        async with session.get(proxy.admin + "/readyz") as r:
            return None, r.status

    code, _ = await eventually_async(
        probe, until=lambda seen: seen[0] is not None or seen[1] == 200, timeout=180, what="the proxy ready"
    )
    assert code is None, f"the proxy exited with {code}: {proxy.stderr()[-3000:]}"


@pytest.fixture
async def cli_proxy(emulator: str, tmp_path: Path) -> AsyncIterator[CliProxy]:
    """`islwatch proxy` in front of the emulator, with worker processes and a `built` model, ready."""
    folder = save_tokenizer("chatml", str(tmp_path / "built"))
    port, admin_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ISLWATCH_") or k == "ISLWATCH_CACHE"}
    log = tmp_path / "proxy.stderr"
    args = [
        "proxy",
        "--upstream",
        emulator,
        "--listen",
        f"127.0.0.1:{port}",
        "--admin",
        f"127.0.0.1:{admin_port}",
    ]
    proc = children.spawn([*args, "--model-tokenizer", f"built={folder}"], log, env=env).proc
    proxy = CliProxy(proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}", Path(folder), log)
    try:
        async with aiohttp.ClientSession() as s:
            await _wait_ready(s, proxy)
        yield proxy
    finally:
        children.stop(proc, signal.SIGKILL)


def _stop_gracefully(proxy: CliProxy) -> None:
    """SIGTERM: a clean exit, and nothing of the prompts (nor a traceback) in the log."""
    proxy.proc.send_signal(signal.SIGTERM)
    assert proxy.proc.wait(60) == 0
    stderr = proxy.stderr()
    assert "Hello there" not in stderr and "Traceback" not in stderr


@pytest.mark.slow  # an islwatch proxy process and its workers
async def test_cli_proxy_analyses_in_worker_processes(cli_proxy: CliProxy) -> None:
    url, admin = cli_proxy.url, cli_proxy.admin
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/chat/completions", json=CHAT) as r:  # unknown name -> "other"
            assert r.status == 200
        async with s.post(url + "/v1/chat/completions", json={**CHAT, "model": "built"}) as r:
            assert r.status == 200
        m = await wait_metrics(s, admin, lambda m: value(m, "islwatch_isl_match_total") == 2)
    # The emulator counts with the built-in Mistral tokenizer, as the default tokenizer does.
    assert value(m, "islwatch_isl_match_total", model="other", result="exact") == 1
    assert value(m, "islwatch_isl_match_total", model="built") == 1
    assert value(m, "islwatch_bad_requests_total", reason="unknown_model") == 1
    assert value(m, "islwatch_analysis_seconds_count") == 2
    assert value(m, "islwatch_parity_ok", model="built") == 1
    assert value(m, "islwatch_tokenizer_changes_total", model="built") == 0
    _stop_gracefully(cli_proxy)


@pytest.mark.slow
async def test_cli_proxy_sighup_reload_detects_a_changed_template(cli_proxy: CliProxy) -> None:
    url, admin = cli_proxy.url, cli_proxy.admin
    async with aiohttp.ClientSession() as s:
        m = await fetch_metrics(s, admin)
        assert value(m, "islwatch_tokenizer_changes_total", model="built") == 0
        # A silent template change on disk, picked up by SIGHUP.
        jinja = cli_proxy.folder / "chat_template.jinja"  # transformers 5 saves the template here
        if jinja.exists():
            jinja.write_text(jinja.read_text().replace("helpful", "useful"))
        else:
            config_file = cli_proxy.folder / "tokenizer_config.json"
            cfg = json.loads(config_file.read_text())
            cfg["chat_template"] = cfg["chat_template"].replace("helpful", "useful")
            config_file.write_text(json.dumps(cfg))
        cli_proxy.proc.send_signal(signal.SIGHUP)
        m = await wait_metrics(
            s, admin, lambda m: value(m, "islwatch_tokenizer_changes_total", model="built") == 1
        )
        assert value(m, "islwatch_tokenizer_changes_total", model="default") == 0
        info = [dict(ls) for (n, ls), v in m.items() if n == "islwatch_tokenizer_info" and v == 1]
        assert sorted(i["model"] for i in info) == ["built", "default"]  # the old series is gone
        async with s.post(admin + "/reload") as r:  # nothing changed since: no new increment
            assert r.status == 200
        m = await fetch_metrics(s, admin)
        assert value(m, "islwatch_tokenizer_changes_total", model="built") == 1
        async with s.post(url + "/v1/chat/completions", json=CHAT) as r:  # the new workers analyse
            assert r.status == 200
        await wait_metrics(s, admin, lambda m: value(m, "islwatch_isl_match_total") == 1)
    _stop_gracefully(cli_proxy)


async def test_full_queue_drops_and_counts_instead_of_waiting() -> None:
    metrics = build_metrics(CollectorRegistry(), process_metrics=False)
    pool = AnalysisPool(AnalysisSpec(tokenizers=()), metrics, mode="thread", workers=1, queue_max=1)
    await pool.start()
    job = AnalysisJob("chat", "default", "", b"", parsed=CHAT)
    # No outcome can be applied before this coroutine yields: what is submitted stays in flight.
    assert pool.submit(job) is True  # queued: 1 in flight
    assert pool.submit(job) is False  # the queue is full: dropped at once
    assert pool.submit(job) is False
    registry = metrics.registry
    assert registry.get_sample_value("islwatch_analysis_dropped_total") == 2
    assert registry.get_sample_value("islwatch_analysis_queue_depth") == 1
    await eventually_async(lambda: pool.in_flight == 0, what="the queued analysis finished")
    assert registry.get_sample_value("islwatch_analysis_queue_depth") == 0
    await pool.close()
