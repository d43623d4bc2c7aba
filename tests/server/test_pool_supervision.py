"""The analysis pool never says it measures when it does not, and notices what a restart loaded.

Real worker processes on real tokenizers, /readyz asked over HTTP. A worker killed (as the OOM killer
would) leaves no live worker: /readyz is 503 `no_live_worker` with the reason until the restarted worker has
loaded and reported; a failed reload meanwhile does not stop that restart; a worker that dies in its first
load is an `error`, not `loading` forever, and the pool recovers when its restart loads; a restart that
loads a tokenizer changed on disk is counted and shown; `islwatch_analysis_workers_live` follows all of it.
The thread backend's queue is bounded by bytes, not only by count.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client import CollectorRegistry

from proxy.server.admin import build_admin
from proxy.server.analyzer import AnalysisSpec
from proxy.server.metrics import Metrics, build_metrics
from proxy.server.pool import AnalysisPool
from proxy.server.processes import MAX_PENDING_BYTES
from proxy.server.records import AnalysisJob
from tests.builders import save_tokenizer
from tests.eventually import eventually_async
from tests.server.helpers import serve_app

CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "Hello there, worker"}]})


@dataclass
class Supervised:
    pool: AnalysisPool
    metrics: Metrics
    session: aiohttp.ClientSession
    admin_url: str
    folder: str

    async def readyz(self) -> tuple[int, dict[str, Any]]:
        async with self.session.get(self.admin_url + "/readyz") as r:
            return r.status, await r.json()

    def sample(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)

    def pid(self) -> int:
        (pid,) = self.pool.worker_pids()
        return pid


@pytest.fixture
async def supervised(tmp_path: Path) -> AsyncIterator[Supervised]:
    """A process pool (one worker) on a tokenizer folder the test may change, not yet started, and its
    admin app served over HTTP."""
    folder = save_tokenizer("chatml", str(tmp_path / "tok"))
    metrics = build_metrics(CollectorRegistry(), process_metrics=False)
    pool = AnalysisPool(AnalysisSpec(tokenizers=(("m", folder),)), metrics)
    try:
        async with serve_app(build_admin(pool, metrics)) as admin_url, aiohttp.ClientSession() as session:
            yield Supervised(pool, metrics, session, admin_url, folder)
    finally:
        await pool.close()
        assert pool.live_workers == 0


async def _readyz_until(s: Supervised, status: str, what: str) -> dict[str, Any]:
    _, body = await eventually_async(s.readyz, until=lambda got: got[1]["status"] == status, what=what)
    return body


async def _analyses_one_job(s: Supervised) -> None:
    before = s.sample("islwatch_isl_tokens_count", model="m", endpoint="chat", kind="bare") or 0.0
    assert s.pool.submit(AnalysisJob("chat", "m", "m", CHAT))
    await eventually_async(
        lambda: s.sample("islwatch_isl_tokens_count", model="m", endpoint="chat", kind="bare"),
        until=lambda n: n == before + 1,
        what="the job analysed",
    )


@pytest.mark.slow  # worker processes started, killed and restarted
async def test_a_dead_worker_is_not_ready_until_its_restart_has_loaded(supervised: Supervised) -> None:
    s = supervised
    await s.pool.start()
    assert (await s.readyz())[0] == 200
    os.kill(s.pid(), signal.SIGKILL)
    # The replacement needs seconds to load; until it has, nothing is measured and /readyz says so.
    body = await _readyz_until(s, "no_live_worker", "/readyz reporting the dead worker")
    assert "worker 0 exited" in body["analysis"]
    assert body["workers_live"] == 0 and s.sample("islwatch_analysis_workers_live") == 0
    body = await _readyz_until(s, "ready", "the restarted worker loading and reporting")
    assert body["tokenizers"] == {"m": "loaded"} and "analysis" not in body
    assert s.sample("islwatch_analysis_workers_live") == 1
    assert s.pool.worker_exits == 1
    await _analyses_one_job(s)


@pytest.mark.slow
async def test_a_failed_reload_leaves_a_pending_restart_alone(supervised: Supervised) -> None:
    """A worker dying twice waits (backs off) before its restart; a reload that fails meanwhile closes only
    its own new workers: the restart still happens and the pool measures again."""
    s = supervised
    await s.pool.start()
    first = s.pid()
    os.kill(first, signal.SIGKILL)
    second = await eventually_async(
        lambda: s.pool.worker_pids(), until=lambda p: p and p != [first], what="a replacement"
    )
    os.kill(second[0], signal.SIGKILL)
    body = await _readyz_until(s, "no_live_worker", "/readyz reporting the dead worker")
    assert "restarting" in body["analysis"]
    good = s.pool.spec
    s.pool.spec = AnalysisSpec(tokenizers=(("m", s.folder + "-missing"),))  # this reload cannot load
    try:
        reports = await s.pool.reload()
    finally:
        s.pool.spec = good
    assert [bool(r.error) for r in reports] == [True]
    await _readyz_until(s, "ready", "the pending restart loading after the failed reload")
    assert s.pool.worker_exits == 2
    await _analyses_one_job(s)


@pytest.mark.slow
async def test_a_worker_dying_in_its_first_load_is_an_error_and_its_restart_recovers(
    supervised: Supervised,
) -> None:
    s = supervised
    starting = asyncio.ensure_future(s.pool.start())
    (pid,) = await eventually_async(s.pool.worker_pids, what="the first worker spawned")
    os.kill(pid, signal.SIGKILL)  # long before it has imported transformers
    with pytest.raises(RuntimeError, match="exited before loading"):
        await starting
    status, body = await s.readyz()
    assert (status, body["status"]) == (503, "error")
    assert "worker 0 exited" in body["analysis"] and "loading its tokenizers" in body["analysis"]
    # The restart loads, reports (identity, self-check) and the pool is ready: not "loading" forever.
    body = await _readyz_until(s, "ready", "the restarted worker loading")
    assert body["tokenizers"] == {"m": "loaded"}
    assert [series["model"] for series in _info_series(s)] == ["m"]  # the identity was reported
    await _analyses_one_job(s)


def _info_series(s: Supervised) -> list[dict[str, str]]:
    return [
        sample.labels
        for family in s.metrics.registry.collect()
        if family.name == "islwatch_tokenizer_info"
        for sample in family.samples
    ]


@pytest.mark.slow
async def test_a_restart_that_loads_a_changed_tokenizer_is_counted_and_shown(supervised: Supervised) -> None:
    s = supervised
    await s.pool.start()
    (before,) = _info_series(s)
    save_tokenizer("llama3", s.folder)  # the files change on disk; nothing reloads them yet
    os.kill(s.pid(), signal.SIGKILL)
    changes = "islwatch_tokenizer_changes_total"
    await eventually_async(lambda: s.sample(changes, model="m"), until=lambda n: n == 1, what="the change")
    (after,) = _info_series(s)  # one identity series: the new one
    assert after["template_sha256"] != before["template_sha256"]
    assert after["tokenizer_sha256"] != before["tokenizer_sha256"]
    status, body = await s.readyz()
    assert (status, body["status"]) == (200, "ready")
    assert body["tokenizer_changed_on_restart"] == ["m"]
    reports = await s.pool.reload()  # every worker onto the new files: no longer listed, not a new change
    assert not any(r.error for r in reports)
    assert "tokenizer_changed_on_restart" not in (await s.readyz())[1]
    assert s.sample(changes, model="m") == 1


@pytest.mark.slow
async def test_an_unwritable_builtin_cache_is_a_load_error_not_a_crash_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "not-a-dir"
    cache.write_text("")
    monkeypatch.setenv("ISLWATCH_CACHE", str(cache))  # the worker inherits it
    metrics = build_metrics(CollectorRegistry(), process_metrics=False)
    pool = AnalysisPool(AnalysisSpec(tokenizers=(("", "builtin:mistral-v0.1"),)), metrics)
    try:
        async with serve_app(build_admin(pool, metrics)) as admin_url, aiohttp.ClientSession() as session:
            await pool.start()
            async with session.get(admin_url + "/readyz") as r:
                status, body = r.status, await r.json()
    finally:
        await pool.close()
    assert (status, body["status"]) == (503, "error")
    assert body["tokenizers"]["default"].startswith("error: cannot write built-in tokenizer")
    assert pool.worker_exits == 0


async def test_thread_queue_is_bounded_by_bytes() -> None:
    """Jobs of 1 MiB each, submitted in one burst (no outcome can come back meanwhile): the queue stops
    taking them at MAX_PENDING_BYTES, long before its count bound; each refusal counted as a drop."""
    metrics = build_metrics(CollectorRegistry(), process_metrics=False)
    spec = AnalysisSpec(tokenizers=())  # nothing to load: each job is a bad-body analysis, fast
    pool = AnalysisPool(spec, metrics, mode="thread", queue_max=256)
    await pool.start()
    try:
        job = AnalysisJob("chat", "m", "m", b"x" * (1 << 20))
        taken = sum(pool.submit(job) for _ in range(100))
        assert taken <= MAX_PENDING_BYTES // (1 << 20) + 1
        assert metrics.registry.get_sample_value("islwatch_analysis_dropped_total") == 100 - taken
        await eventually_async(lambda: pool.in_flight, until=lambda n: n == 0, what="the queue draining")
        assert pool.submit(job)  # the bound is on what is queued now
        assert metrics.registry.get_sample_value("islwatch_analysis_workers_live") == 1  # the one thread
    finally:
        await pool.close()
