"""The process backend of the analysis pool: one generation of `python -m proxy.server.worker` children.

Each worker is spoken to through two pipes, both driven by the event loop itself (no helper threads, no
pickling): a job is one `write` of a frame holding the raw request bytes into a non-blocking pipe
transport; outcomes come back as orjson lines (frames.py). A worker that dies is reported to the pool
(`on_exit`, its unanswered jobs `on_lost`) and restarted, backing off when it keeps dying; traffic never
waits for it. A restarted worker loads the tokenizers from disk again and reports them (identities, the
parity self-check) through `on_restarted`, so a tokenizer changed on disk is noticed. `loaded` counts the
workers that run with their tokenizers loaded; `trouble` says why none does. A reload builds a new
generation and retires the old one, whose workers finish their queue and exit on end of input.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from proxy.server.frames import OUTCOME, READY, decode_outcome, encode_job
from proxy.server.records import AnalysisJob, AnalysisOutcome, TokenizerReport

log = logging.getLogger("islwatch.analysis")


class WorkerExited(RuntimeError):
    """A worker process exited before it had loaded its tokenizers (content-free message)."""


def _exit_text(index: int, code: int | None, was_loaded: bool) -> str:
    return (
        f"worker {index} exited"
        + ("" if code is None else f" with code {code}")
        + ("" if was_loaded else " while loading its tokenizers")
    )


# Bytes queued for one worker beyond what its pipe holds; above this, jobs are dropped (bodies can be MBs).
MAX_PENDING_BYTES = 32 << 20
STOP_SECONDS = 3.0  # a retiring worker gets this long to finish its queue before it is killed
# The worker runs the parent's own copy of the package, whatever the working directory holds.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def _worker_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": _PACKAGE_ROOT + (os.pathsep + path if path else "")}


class Worker:
    """One worker process and the two pipe transports the event loop talks to it through."""

    def __init__(self, generation: Processes, index: int) -> None:
        self.generation = generation
        self.index = index
        self.proc: subprocess.Popen[bytes] | None = None
        self.writer: asyncio.WriteTransport | None = None
        self.reader: asyncio.ReadTransport | None = None
        self.in_flight = 0
        self.ready: asyncio.Future[list[TokenizerReport] | None] = asyncio.get_running_loop().create_future()
        self.gone = False  # its output pipe closed: it exited (or is about to)
        self.retiring = False  # asked to stop: not an unexpected exit
        self._connecting: asyncio.Task[None] | None = None

    @property
    def loaded(self) -> bool:
        """Running, with its tokenizers loaded: it analyses the jobs it is sent."""
        ready = self.ready
        return not self.gone and ready.done() and not ready.cancelled() and ready.exception() is None

    def start(self, spec_json: str, describe: bool) -> None:
        job_r, job_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "proxy.server.worker", str(job_r), str(out_w),
                 "1" if describe else "0", spec_json],
                pass_fds=(job_r, out_w),
                stdin=subprocess.DEVNULL,
                env=_worker_env(),
            )  # fmt: skip
        except BaseException:
            for fd in (job_w, out_r):
                os.close(fd)
            raise
        finally:
            os.close(job_r)  # the child's ends: the parent must not hold them, or EOF never comes
            os.close(out_w)
        loop = asyncio.get_running_loop()
        job_file = os.fdopen(job_w, "wb", buffering=0)
        out_file = os.fdopen(out_r, "rb", buffering=0)

        async def connect() -> None:
            self.writer, _ = await loop.connect_write_pipe(asyncio.Protocol, job_file)
            self.reader, _ = await loop.connect_read_pipe(lambda: _OutcomePipe(self), out_file)

        self._connecting = loop.create_task(connect())

    async def connected(self) -> None:
        assert self._connecting is not None
        await self._connecting

    def retire(self) -> None:
        """Close its input: it finishes the jobs already sent, reports them, and exits on end of input."""
        self.retiring = True
        if self.writer is None and self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
        if self.writer is not None and not self.writer.is_closing():
            self.writer.close()

    def line(self, line: bytes) -> None:
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:  # e.g. a library printing to the inherited descriptor: not ours
            return
        if row[0] == OUTCOME:
            self.in_flight -= 1
            self.generation.on_outcome(decode_outcome(row))
        elif row[0] == READY and not self.ready.done():
            reports = row[1]
            self.ready.set_result(None if reports is None else [TokenizerReport.from_row(r) for r in reports])


class _OutcomePipe(asyncio.Protocol):
    """Splits the worker's output into lines; end of file means the worker is gone."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.partial = b""

    def data_received(self, data: bytes) -> None:
        if self.partial:
            data = self.partial + data
        start = 0
        line = self.worker.line
        while (end := data.find(b"\n", start)) >= 0:
            line(data[start:end])
            start = end + 1
        self.partial = data[start:]

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.worker.generation.worker_gone(self.worker)


class Processes:
    """One generation of worker processes, started together, restarted one by one, retired together."""

    def __init__(
        self,
        spec_json: str,
        count: int,
        on_outcome: Callable[[AnalysisOutcome], None],
        on_lost: Callable[[int], None],
        on_exit: Callable[[], None],
        on_restarted: Callable[[Processes, list[TokenizerReport]], None],
    ) -> None:
        self.spec_json = spec_json
        self.count = max(1, count)
        self.on_outcome = on_outcome
        self.on_lost = on_lost  # jobs a dead worker never answered
        self.on_exit = on_exit  # a worker died unexpectedly
        self.on_restarted = on_restarted  # a restarted worker loaded the tokenizers again: its reports
        self.workers: list[Worker] = []
        self.closing = False
        self.last_exit: str | None = None  # the last unexpected exit, content-free
        self._exits: list[float] = []  # times of unexpected exits, for the restart back-off
        self._live: set[Worker] = set()  # every process of this generation not yet reaped
        self._reaping: set[asyncio.Task[None]] = set()

    async def start(self) -> list[TokenizerReport]:
        """Start every worker and wait until each has loaded; the reports of the first (identities and
        the parity self-check are checked once per load)."""
        for i in range(self.count):
            self._spawn(i, describe=i == 0)
        workers = list(self.workers)
        await asyncio.gather(*(w.connected() for w in workers))
        results = await asyncio.gather(*(w.ready for w in workers))
        return results[0] or []

    def submit(self, job: AnalysisJob) -> bool:
        worker = self._pick()
        if worker is None or worker.writer is None:
            return False
        worker.writer.write(encode_job(job))
        worker.in_flight += 1
        return True

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers if w.proc is not None]

    @property
    def live(self) -> int:
        """Worker processes of this generation not yet reaped (retired and restarted ones included)."""
        return len(self._live)

    @property
    def loaded(self) -> int:
        """Workers taking jobs: running, with their tokenizers loaded."""
        return 0 if self.closing else sum(w.loaded for w in self.workers)

    @property
    def trouble(self) -> str | None:
        """Why no worker takes jobs, when none does (content-free)."""
        if self.loaded:
            return None
        if self.closing:
            return "analysis workers stopped"
        if self.last_exit is not None:
            return f"no analysis worker running: {self.last_exit}; restarting"
        return "analysis workers loading"

    def retire(self) -> None:
        """Stop receiving jobs; the workers finish what they were sent and exit."""
        self.closing = True
        for w in self.workers:
            w.retire()

    async def close(self) -> None:
        self.closing = True
        workers = list(self._live)
        for w in workers:
            w.retire()
            if w.proc is not None and w.writer is None:  # never connected: nothing will close its input
                w.proc.terminate()
        await asyncio.gather(*(self._reap(w) for w in workers), return_exceptions=True)
        for task in list(self._reaping):
            task.cancel()

    def _spawn(self, index: int, describe: bool) -> Worker:
        worker = Worker(self, index)
        worker.start(self.spec_json, describe)
        self._live.add(worker)
        if index < len(self.workers):
            self.workers[index] = worker
        else:
            self.workers.append(worker)
        return worker

    def _pick(self) -> Worker | None:
        best: Worker | None = None
        for w in self.workers:
            if w.gone or w.retiring or w.writer is None:
                continue
            if best is None or w.in_flight < best.in_flight:
                best = w
        if best is None or best.writer is None or best.writer.get_write_buffer_size() > MAX_PENDING_BYTES:
            return None
        return best

    def worker_gone(self, worker: Worker) -> None:
        """The worker's output ended: it exited. Its unanswered jobs are lost (reported); restart it."""
        if worker.gone:
            return
        worker.gone = True
        if worker.writer is not None and not worker.writer.is_closing():
            worker.writer.abort()
        lost, worker.in_flight = worker.in_flight, 0
        if lost:
            self.on_lost(lost)
        expected = worker.retiring or self.closing
        # `ready` is cancelled when the start that awaited it was (a port already in use stops the start-up
        # while workers load): `.exception()` would raise CancelledError here, in a pipe callback.
        ready = worker.ready
        was_loaded = ready.done() and not ready.cancelled() and ready.exception() is None
        if not expected:  # said at once (the exit code follows once it is reaped)
            self.last_exit = _exit_text(worker.index, None, was_loaded)
        if not worker.ready.done():
            worker.ready.set_exception(
                WorkerExited(f"analysis worker {worker.index} exited before loading its tokenizers")
            )
            worker.ready.exception()  # retrieved here: a reload's gather may not be waiting for it
        task = asyncio.get_running_loop().create_task(self._after_exit(worker, expected, lost, was_loaded))
        self._reaping.add(task)
        task.add_done_callback(self._reaping.discard)

    async def _after_exit(self, worker: Worker, expected: bool, lost: int, was_loaded: bool) -> None:
        code = await self._reap(worker)
        if expected:
            return
        self.on_exit()
        self.last_exit = _exit_text(worker.index, code, was_loaded)
        log.error("analysis %s; %d analyses lost; restarting it", self.last_exit, lost)
        now = time.monotonic()
        self._exits = [t for t in self._exits if now - t < 60.0] + [now]
        # Back off when it keeps dying (a tokenizer that crashes on load, memory limits): 0, 1, 2, 4... 30 s.
        delay = 0.0 if len(self._exits) <= 1 else min(30.0, 2.0 ** (len(self._exits) - 2))
        if delay:
            await asyncio.sleep(delay)
        if self.closing:
            return
        # The replacement loads from disk again and reports what it loaded: the pool compares identities.
        replacement = self._spawn(worker.index, describe=True)
        try:
            await replacement.connected()
            reports = await replacement.ready
        except WorkerExited:
            return  # it died too: its own exit restarts it
        except Exception as exc:
            log.error("analysis worker %d could not be restarted: %s", worker.index, type(exc).__name__)
            return
        if reports is not None and not self.closing:
            self.on_restarted(self, reports)

    async def _reap(self, worker: Worker, timeout: float = STOP_SECONDS) -> int | None:
        proc = worker.proc
        try:
            if proc is None:
                return None
            deadline = time.monotonic() + timeout
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    proc.kill()
                    return await asyncio.get_running_loop().run_in_executor(None, proc.wait)
                await asyncio.sleep(0.02)
            return proc.returncode
        finally:
            if worker.reader is not None:
                worker.reader.close()
            self._live.discard(worker)
