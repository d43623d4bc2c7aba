"""Process-mode analysis: worker processes fed through pipes by the event loop.

The frames round-trip; a real worker process analyses real jobs (outcomes reach the metrics); a full queue
drops and counts at once; a killed worker never breaks submission, its lost jobs are counted and it is
restarted; a reload swaps workers only once the new ones loaded; no worker process outlives `close()`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry

from proxy.core.count import count_request
from proxy.server.analyzer import AnalysisSpec
from proxy.server.frames import FRAME_HEAD, decode_job, decode_outcome, encode_job, encode_outcome
from proxy.server.metrics import Metrics, build_metrics
from proxy.server.pool import AnalysisPool
from proxy.server.records import DEFAULT_KEY, AnalysisJob, AnalysisOutcome
from tests.builders import build_tokenizer, save_tokenizer

CHAT = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hello there, worker"}]}


def _job(server_tokens: int | None = None, body: dict | None = None) -> AnalysisJob:
    return AnalysisJob(
        "chat", "default", DEFAULT_KEY, orjson.dumps(body or CHAT), server_tokens=server_tokens
    )


def _sample(m: Metrics, name: str, **labels: str) -> float:
    return m.registry.get_sample_value(name, labels) or 0.0


async def _until(check: Callable[[], bool], seconds: float = 60.0) -> None:
    for _ in range(int(seconds / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pids(pool: AnalysisPool) -> list[int]:
    return pool.worker_pids()


@pytest.mark.parametrize("response", [None, b"", b'{"usage": {"prompt_tokens": 7}}'])
def test_job_frame_round_trips(response: bytes | None) -> None:
    job = AnalysisJob(
        "chat", "m", "k", b'{"a": "\xc3\xa9"}', server_tokens=5, response_json=response, streamed=True
    )
    frame = encode_job(job)
    header_len, payload_len = FRAME_HEAD.unpack(frame[: FRAME_HEAD.size])
    header = frame[FRAME_HEAD.size : FRAME_HEAD.size + header_len]
    payload = frame[FRAME_HEAD.size + header_len :]
    assert len(payload) == payload_len
    assert decode_job(header, payload) == job


def test_outcome_line_round_trips() -> None:
    outcome = AnalysisOutcome(
        "chat", "m", 0.5, 1, 2, 3, 4, "mismatch", "duplicate_bos", None, None, "d", True
    )
    line = encode_outcome(outcome)
    assert line.endswith(b"\n") and b"\n" not in line[:-1]
    assert decode_outcome(orjson.loads(line)) == outcome


def test_spec_crosses_as_json() -> None:
    spec = AnalysisSpec(tokenizers=(("", "builtin:mistral-v0.1"), ("m", "/x")), dump_dir="/d", dump_max=3)
    assert AnalysisSpec.from_json(spec.to_json()) == spec


@pytest.fixture(scope="module")
def built_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_tokenizer("chatml", str(tmp_path_factory.mktemp("tok") / "chatml"))


async def test_worker_process_analyses_drops_when_full_and_survives_a_crash(built_folder: str) -> None:
    expected = count_request(build_tokenizer("chatml"), "chat", CHAT).expected_server
    assert expected is not None
    metrics = build_metrics(CollectorRegistry(), process_metrics=False)
    pool = AnalysisPool(AnalysisSpec(tokenizers=((DEFAULT_KEY, built_folder),)), metrics, queue_max=2)
    await pool.start()
    try:
        assert pool.ready and [r.label for r in pool.reports] == ["default"]
        assert pool.reports[0].identity is not None

        # Outcomes come back and are applied: one exact, one mismatch.
        assert pool.submit(_job(server_tokens=expected))
        assert pool.submit(_job(server_tokens=expected + 1))
        # Two in flight (no outcome can be read before this coroutine yields): the next one is dropped.
        assert pool.submit(_job()) is False
        assert _sample(metrics, "islwatch_analysis_dropped_total") == 1
        assert _sample(metrics, "islwatch_analysis_queue_depth") == 2
        await _until(lambda: pool.in_flight == 0)
        assert (
            _sample(metrics, "islwatch_isl_match_total", model="default", endpoint="chat", result="exact")
            == 1
        )
        assert (
            _sample(metrics, "islwatch_isl_match_total", model="default", endpoint="chat", result="mismatch")
            == 1
        )
        assert (
            _sample(metrics, "islwatch_isl_tokens_count", model="default", endpoint="chat", kind="templated")
            == 2
        )
        assert _sample(metrics, "islwatch_analysis_queue_depth") == 0

        # A body that is not a request is counted as such by the worker, not a crash.
        assert pool.submit(AnalysisJob("chat", "default", DEFAULT_KEY, b"[1, 2]"))
        await _until(lambda: pool.in_flight == 0)
        assert _sample(metrics, "islwatch_bad_requests_total", reason="not_a_request") == 1

        # Kill the worker with jobs in flight: submission never fails or blocks, every job is either
        # analysed or counted as dropped, and a new worker takes over.
        (old_pid,) = _pids(pool)
        analysed = _sample(metrics, "islwatch_analysis_seconds_count")
        dropped = _sample(metrics, "islwatch_analysis_dropped_total")
        assert pool.submit(_job(server_tokens=expected)) and pool.submit(_job(server_tokens=expected))
        os.kill(old_pid, signal.SIGKILL)
        await _until(lambda: pool.worker_exits == 1 and pool.in_flight == 0)
        done = _sample(metrics, "islwatch_analysis_seconds_count") - analysed
        lost = _sample(metrics, "islwatch_analysis_dropped_total") - dropped
        assert done + lost == 2
        assert _sample(metrics, "islwatch_analysis_worker_exits_total") == 1
        await _until(lambda: _pids(pool) != [old_pid])
        assert not _alive(old_pid)  # reaped, not a zombie
        for _ in range(3):  # while the replacement loads, submissions queue (or drop, counted); never raise
            pool.submit(_job(server_tokens=expected))
        await _until(lambda: pool.in_flight == 0)
        before = _sample(
            metrics, "islwatch_isl_match_total", model="default", endpoint="chat", result="exact"
        )
        assert pool.submit(_job(server_tokens=expected))
        await _until(lambda: pool.in_flight == 0)
        after = _sample(metrics, "islwatch_isl_match_total", model="default", endpoint="chat", result="exact")
        assert after == before + 1  # the restarted worker analyses
        pids = _pids(pool)
    finally:
        await pool.close()
    assert not any(_alive(pid) for pid in pids)
    assert pool.live_workers == 0


async def test_reload_swaps_only_loaded_workers_and_leaves_no_process(tmp_path: Path) -> None:
    folder = save_tokenizer("chatml", str(tmp_path / "tok"))
    metrics = build_metrics(CollectorRegistry(), process_metrics=False)
    pool = AnalysisPool(AnalysisSpec(tokenizers=(("m", folder),)), metrics, workers=2)
    await pool.start()
    seen: list[int] = []
    try:
        first = _pids(pool)
        assert len(first) == 2
        seen += first
        reports = await pool.reload()  # same files: loads, swaps, the old workers exit
        assert not any(r.error for r in reports)
        second = _pids(pool)
        seen += second
        assert set(second).isdisjoint(first)
        await _until(lambda: not any(_alive(pid) for pid in first))

        shutil.rmtree(folder)  # the next reload cannot load: the current workers keep serving
        reports = await pool.reload()
        assert [bool(r.error) for r in reports] == [True]
        assert _pids(pool) == second and pool.ready
        assert pool.submit(AnalysisJob("chat", "m", "m", orjson.dumps(CHAT)))
        await _until(lambda: pool.in_flight == 0)
        assert _sample(metrics, "islwatch_isl_tokens_count", model="m", endpoint="chat", kind="bare") == 1
    finally:
        await pool.close()
    assert pool.worker_exits == 0  # retired workers are not crashes
    assert not any(_alive(pid) for pid in seen)
    assert pool.live_workers == 0
