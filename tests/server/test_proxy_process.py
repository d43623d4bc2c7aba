"""The real `islwatch proxy` command (worker processes, the default): readiness, analysis in another
process, SIGHUP reload that detects a changed template, graceful SIGTERM. And the bounded queue: a full
queue drops analyses (counted) instead of waiting."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from proxy.emulator.app import EmulatorConfig, build_emulator_app
from proxy.server.analyzer import AnalysisSpec
from proxy.server.metrics import build_metrics
from proxy.server.pool import AnalysisPool
from proxy.server.records import AnalysisJob
from tests.builders import save_tokenizer
from tests.conftest import load_builtin
from tests.eventually import eventually_async
from tests.server.helpers import Background, fetch_metrics, serve_app, value, wait_metrics

CHAT = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hello there"}]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def emulator() -> Iterator[str]:
    bg = Background()
    url = bg.enter(serve_app(build_emulator_app(EmulatorConfig(), tokenizer=load_builtin())))
    yield url
    bg.close()


async def _wait_ready(session: aiohttp.ClientSession, admin: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            async with session.get(admin + "/readyz") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.1)
    raise AssertionError("proxy never became ready")


async def test_cli_proxy_with_worker_processes_and_sighup_reload(emulator: str, tmp_path: Path) -> None:
    folder = save_tokenizer("chatml", str(tmp_path / "built"))
    port, admin_port = _free_port(), _free_port()
    url, admin = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ISLWATCH_") or k == "ISLWATCH_CACHE"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "proxy.cli",
            "proxy",
            "--upstream",
            emulator,
            "--listen",
            f"127.0.0.1:{port}",
            "--admin",
            f"127.0.0.1:{admin_port}",
            "--model-tokenizer",
            f"built={folder}",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        async with aiohttp.ClientSession() as s:
            await _wait_ready(s, admin, proc)
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

            # A silent template change on disk, picked up by SIGHUP.
            jinja = Path(folder) / "chat_template.jinja"  # transformers 5 saves the template here
            if jinja.exists():
                jinja.write_text(jinja.read_text().replace("helpful", "useful"))
            else:
                config_file = Path(folder) / "tokenizer_config.json"
                cfg = json.loads(config_file.read_text())
                cfg["chat_template"] = cfg["chat_template"].replace("helpful", "useful")
                config_file.write_text(json.dumps(cfg))
            proc.send_signal(signal.SIGHUP)
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
            await wait_metrics(s, admin, lambda m: value(m, "islwatch_isl_match_total") == 3)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = proc.stderr.read() if proc.stderr else ""
    assert "Hello there" not in stderr and "Traceback" not in stderr


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
