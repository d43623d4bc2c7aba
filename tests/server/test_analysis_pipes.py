"""Process-mode analysis: worker processes fed through pipes by the event loop.

The frames round-trip; a real worker process analyses real jobs (outcomes reach the metrics); a full queue
drops and counts at once; a killed worker never breaks submission, its lost jobs are counted and it is
restarted; a reload swaps workers only once the new ones loaded; no worker process outlives `close()`.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry

from proxy.core.count import count_request
from proxy.server.analyzer import AnalysisSpec
from proxy.server.app import analysis_spec
from proxy.server.config import ProxyConfig
from proxy.server.frames import FRAME_HEAD, decode_job, decode_outcome, encode_job, encode_outcome
from proxy.server.metrics import Metrics, build_metrics
from proxy.server.pool import AnalysisPool
from proxy.server.records import DEFAULT_KEY, AnalysisJob, AnalysisOutcome
from tests.builders import build_tokenizer, save_tokenizer
from tests.eventually import eventually_async

CHAT = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hello there, worker"}]}


def _job(server_tokens: int | None = None, body: dict | None = None) -> AnalysisJob:
    return AnalysisJob(
        "chat", "default", DEFAULT_KEY, orjson.dumps(body or CHAT), server_tokens=server_tokens
    )


def _sample(m: Metrics, name: str, **labels: str) -> float:
    return m.registry.get_sample_value(name, labels) or 0.0


async def _idle(pool: AnalysisPool) -> None:
    """Until every submitted job is finished or counted lost."""
    await eventually_async(lambda: pool.in_flight, until=lambda n: n == 0, what="the pool finishing its jobs")


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


@pytest.fixture(scope="module")
def exact_count() -> int:
    """The server count that matches CHAT exactly on the built tokenizer."""
    expected = count_request(build_tokenizer("chatml"), "chat", CHAT).expected_server
    assert expected is not None
    return expected


@dataclass
class Worker:
    pool: AnalysisPool
    metrics: Metrics
    exact: int


@pytest.fixture
async def worker(built_folder: str, exact_count: int) -> AsyncIterator[Worker]:
    """A started process-mode pool: one worker process, a queue of two."""
    metrics = build_metrics(CollectorRegistry(), process_metrics=False)
    pool = AnalysisPool(AnalysisSpec(tokenizers=((DEFAULT_KEY, built_folder),)), metrics, queue_max=2)
    await pool.start()
    try:
        yield Worker(pool, metrics, exact_count)
    finally:
        await pool.close()


def _matches(m: Metrics, result: str) -> float:
    return _sample(m, "islwatch_isl_match_total", model="default", endpoint="chat", result=result)


@pytest.mark.slow  # a worker process each; test_worker_process_outcomes_are_applied stays in the fast lane
async def test_worker_process_loads_and_reports_the_tokenizer(worker: Worker) -> None:
    pool = worker.pool
    assert pool.ready and [r.label for r in pool.reports] == ["default"]
    assert pool.reports[0].identity is not None


async def test_worker_process_outcomes_are_applied(worker: Worker) -> None:
    pool, metrics = worker.pool, worker.metrics
    assert pool.submit(_job(server_tokens=worker.exact))
    assert pool.submit(_job(server_tokens=worker.exact + 1))
    await _idle(pool)
    assert _matches(metrics, "exact") == 1
    assert _matches(metrics, "mismatch") == 1
    assert (
        _sample(metrics, "islwatch_isl_tokens_count", model="default", endpoint="chat", kind="templated") == 2
    )
    assert _sample(metrics, "islwatch_analysis_queue_depth") == 0


@pytest.mark.slow
async def test_full_queue_drops_at_once_and_counts(worker: Worker) -> None:
    pool, metrics = worker.pool, worker.metrics
    assert pool.submit(_job(server_tokens=worker.exact))
    assert pool.submit(_job(server_tokens=worker.exact + 1))
    # Two in flight (no outcome can be read before this coroutine yields): the next one is dropped.
    assert pool.submit(_job()) is False
    assert _sample(metrics, "islwatch_analysis_dropped_total") == 1
    assert _sample(metrics, "islwatch_analysis_queue_depth") == 2
    await _idle(pool)
    assert _sample(metrics, "islwatch_analysis_queue_depth") == 0


@pytest.mark.slow
async def test_body_that_is_not_a_request_is_counted_not_a_crash(worker: Worker) -> None:
    pool, metrics = worker.pool, worker.metrics
    assert pool.submit(AnalysisJob("chat", "default", DEFAULT_KEY, b"[1, 2]"))
    await _idle(pool)
    assert _sample(metrics, "islwatch_bad_requests_total", reason="not_a_request") == 1
    assert pool.worker_exits == 0


@pytest.mark.slow
async def test_killed_worker_loses_no_job_uncounted_and_is_restarted(worker: Worker) -> None:
    """Kill the worker with jobs in flight: submission never fails or blocks, every job is either analysed
    or counted as dropped, and a new worker takes over (and is gone after close)."""
    pool, metrics, exact = worker.pool, worker.metrics, worker.exact
    (old_pid,) = _pids(pool)
    analysed = _sample(metrics, "islwatch_analysis_seconds_count")
    dropped = _sample(metrics, "islwatch_analysis_dropped_total")
    assert pool.submit(_job(server_tokens=exact)) and pool.submit(_job(server_tokens=exact))
    os.kill(old_pid, signal.SIGKILL)
    await eventually_async(
        lambda: (pool.worker_exits, pool.in_flight),
        until=lambda seen: seen == (1, 0),
        what="the pool noticing the worker exit and settling its jobs",
    )
    done = _sample(metrics, "islwatch_analysis_seconds_count") - analysed
    lost = _sample(metrics, "islwatch_analysis_dropped_total") - dropped
    assert done + lost == 2
    assert _sample(metrics, "islwatch_analysis_worker_exits_total") == 1
    await eventually_async(
        lambda: _pids(pool), until=lambda pids: pids != [old_pid], what="a replacement worker"
    )
    assert not _alive(old_pid)  # reaped, not a zombie
    for _ in range(3):  # while the replacement loads, submissions queue (or drop, counted); never raise
        pool.submit(_job(server_tokens=exact))
    await _idle(pool)
    before = _matches(metrics, "exact")
    # The replacement takes jobs once its pipes are connected (a drop before that is counted, not raised).
    await eventually_async(
        lambda: pool.submit(_job(server_tokens=exact)), what="the replacement taking a job"
    )
    await _idle(pool)
    assert _matches(metrics, "exact") == before + 1  # the restarted worker analyses
    pids = _pids(pool)
    await pool.close()
    assert not any(_alive(pid) for pid in pids)
    assert pool.live_workers == 0


@pytest.mark.slow
async def test_close_leaves_no_worker_process(worker: Worker) -> None:
    pool = worker.pool
    assert pool.submit(_job(server_tokens=worker.exact))
    await _idle(pool)
    pids = _pids(pool)
    assert pids
    await pool.close()
    assert not any(_alive(pid) for pid in pids)
    assert pool.live_workers == 0


@pytest.fixture
async def two_workers(tmp_path: Path) -> AsyncIterator[tuple[AnalysisPool, Metrics, str]]:
    """A process pool of two workers on a tokenizer folder the test may change."""
    folder = save_tokenizer("chatml", str(tmp_path / "tok"))
    metrics = build_metrics(CollectorRegistry(), process_metrics=False)
    pool = AnalysisPool(AnalysisSpec(tokenizers=(("m", folder),)), metrics, workers=2)
    await pool.start()
    try:
        yield pool, metrics, folder
    finally:
        await pool.close()


async def _close_leaves_nothing(pool: AnalysisPool, seen: list[int]) -> None:
    await pool.close()
    assert pool.worker_exits == 0  # retired workers are not crashes
    assert not any(_alive(pid) for pid in seen)
    assert pool.live_workers == 0


@pytest.mark.slow
async def test_reload_swaps_in_loaded_workers_and_retires_the_old(
    two_workers: tuple[AnalysisPool, Metrics, str],
) -> None:
    pool, _, _ = two_workers
    first = _pids(pool)
    assert len(first) == 2
    reports = await pool.reload()  # same files: loads, swaps, the old workers exit
    assert not any(r.error for r in reports)
    second = _pids(pool)
    assert set(second).isdisjoint(first)
    await eventually_async(
        lambda: [pid for pid in first if _alive(pid)],
        until=lambda left: not left,
        what="the old workers exiting",
    )
    await _close_leaves_nothing(pool, first + second)


@pytest.mark.slow
async def test_failed_reload_keeps_the_current_workers_serving(
    two_workers: tuple[AnalysisPool, Metrics, str],
) -> None:
    pool, metrics, folder = two_workers
    current = _pids(pool)
    shutil.rmtree(folder)  # the reload cannot load: the current workers keep serving
    reports = await pool.reload()
    assert [bool(r.error) for r in reports] == [True]
    assert _pids(pool) == current and pool.ready
    assert pool.submit(AnalysisJob("chat", "m", "m", orjson.dumps(CHAT)))
    await _idle(pool)
    assert _sample(metrics, "islwatch_isl_tokens_count", model="m", endpoint="chat", kind="bare") == 1
    await _close_leaves_nothing(pool, current)


@pytest.mark.slow
@pytest.mark.parametrize("nice", [0, 10])
async def test_worker_processes_run_nicer_than_the_event_loop(built_folder: str, nice: int) -> None:
    """Once loaded, a worker yields a busy CPU to the relay (config analysis_nice, default 10)."""
    metrics = build_metrics(CollectorRegistry(), process_metrics=False)
    pool = AnalysisPool(AnalysisSpec(tokenizers=((DEFAULT_KEY, built_folder),), nice=nice), metrics)
    await pool.start()
    try:
        (pid,) = pool.worker_pids()
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, ours + nice)
    finally:
        await pool.close()


def test_the_default_worker_niceness_reaches_the_spec() -> None:
    assert analysis_spec(ProxyConfig(upstream="http://127.0.0.1:1")).nice == 10
    assert analysis_spec(ProxyConfig(upstream="http://127.0.0.1:1", analysis_nice=0)).nice == 0
