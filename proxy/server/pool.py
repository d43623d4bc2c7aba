"""The bounded analysis pool: counting happens here, off the response path, and never delays traffic.

`submit(job)` is synchronous and cheap (called from the handler's `finally`): when `analysis_queue` analyses
are already in flight the job is dropped and counted (`islwatch_analysis_dropped_total`), so a slow
tokenizer can only lose measurements, never add latency. Workers are processes by default (tokenization
and Jinja rendering hold the GIL; a process uses the second core and leaves the event loop alone), threads
as an option (no start-up cost, shares the loop's core). Each worker loads its tokenizers once.

Process workers are `python -m proxy.worker` children spoken to through two pipes each, both driven by the
event loop itself (no helper threads, no pickling): a job is one `write` of a frame holding the raw request
bytes into a non-blocking pipe transport; outcomes come back as orjson lines. A worker that dies is logged and
counted (`worker_exits`), its unanswered jobs count as dropped (`islwatch_analysis_dropped_total`), and it
is restarted (backing off when it keeps dying); traffic never waits for it.

Outcomes are applied on the event loop thread, the only place metrics are updated.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from proxy.server.metrics import Metrics
from proxy.server.records import (
    OUTCOME,
    READY,
    AnalysisJob,
    AnalysisOutcome,
    ProblemLog,
    TokenizerReport,
    decode_outcome,
    encode_job,
)
from proxy.server.worker import AnalysisSpec, WorkerState, spec_to_json

log = logging.getLogger("islwatch.analysis")

# Bytes queued for one worker beyond what its pipe holds; above this, jobs are dropped (bodies can be MBs).
MAX_PENDING_BYTES = 32 << 20
STOP_SECONDS = 3.0  # a retiring worker gets this long to finish its queue before it is terminated
# The worker runs the parent's own copy of the package, whatever the working directory holds.
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
_WORKER_MAIN = "import sys; sys.path.insert(0, sys.argv[1]); from proxy.server.worker import main; sys.exit(main(sys.argv[2:]))"


class _Backend:
    """One generation of workers. Thread mode: the state the threads share, set once loaded."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.state: WorkerState | None = None
        self.loaded = threading.Event()


class _Worker:
    """One worker process and the two pipe transports the event loop talks to it through."""

    def __init__(self, pool: AnalysisPool, generation: _Processes, index: int) -> None:
        self.pool = pool
        self.generation = generation
        self.index = index
        self.proc: subprocess.Popen[bytes] | None = None
        self.writer: asyncio.WriteTransport | None = None
        self.reader: asyncio.ReadTransport | None = None
        self.in_flight = 0
        self.ready: asyncio.Future[list[TokenizerReport] | None] = asyncio.get_running_loop().create_future()
        self.gone = False  # its output pipe closed: it exited (or is about to)
        self.retiring = False  # asked to stop: not an unexpected exit

    def start(self, spec_json: str, describe: bool) -> None:
        job_r, job_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER_MAIN, _PACKAGE_ROOT, str(job_r), str(out_w),
                 "1" if describe else "0", spec_json],
                pass_fds=(job_r, out_w),
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except BaseException:
            for fd in (job_w, out_r):
                os.close(fd)
            raise
        finally:
            os.close(job_r)  # the child's ends: the parent must not hold them, or EOF never comes
            os.close(out_w)

        loop = asyncio.get_running_loop()
        self._job_file = os.fdopen(job_w, "wb", buffering=0)
        self._out_file = os.fdopen(out_r, "rb", buffering=0)

        async def connect() -> None:
            self.writer, _ = await loop.connect_write_pipe(lambda: _JobPipe(self), self._job_file)
            self.reader, _ = await loop.connect_read_pipe(lambda: _OutcomePipe(self), self._out_file)

        self._connecting = loop.create_task(connect())

    async def connected(self) -> None:
        await self._connecting

    def retire(self) -> None:
        """Close its input: it finishes the jobs already sent, reports them, and exits on end of input."""
        self.retiring = True
        if self.writer is not None and not self.writer.is_closing():
            self.writer.close()

    def line(self, line: bytes) -> None:
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:  # e.g. a library printing to the inherited descriptor: not ours
            return
        if row[0] == OUTCOME:
            self.in_flight -= 1
            self.pool.finished(decode_outcome(row))
        elif row[0] == READY and not self.ready.done():
            reports = row[1]
            self.ready.set_result(None if reports is None else [TokenizerReport.from_row(r) for r in reports])


class _JobPipe(asyncio.Protocol):
    """The write side needs a protocol; a worker's death is noticed on its outcome pipe (end of file)."""

    def __init__(self, worker: _Worker) -> None:
        self.worker = worker


class _OutcomePipe(asyncio.Protocol):
    """Splits the worker's output into lines; end of file means the worker is gone."""

    def __init__(self, worker: _Worker) -> None:
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
        self.worker.pool.worker_gone(self.worker)


class _Processes:
    """One generation of worker processes (a reload builds a new one and swaps it in when it has loaded)."""

    def __init__(self, count: int) -> None:
        self.workers: list[_Worker] = []
        self.count = count
        self.closing = False
        self.exits: list[float] = []  # times of unexpected exits, for the restart back-off

    def pick(self) -> _Worker | None:
        best: _Worker | None = None
        for w in self.workers:
            if w.gone or w.retiring or w.writer is None:
                continue
            if best is None or w.in_flight < best.in_flight:
                best = w
        if best is None or best.writer is None or best.writer.get_write_buffer_size() > MAX_PENDING_BYTES:
            return None
        return best


class AnalysisPool:
    def __init__(
        self,
        spec: AnalysisSpec,
        metrics: Metrics,
        mode: str = "process",
        workers: int = 1,
        queue_max: int = 256,
    ) -> None:
        self.spec = spec
        self.metrics = metrics
        self.mode = mode
        self.workers = workers
        self.queue_max = queue_max
        self.in_flight = 0
        self.worker_exits = 0  # worker processes that died unexpectedly (each restarted; logged)
        self.ready = False
        self.reports: list[TokenizerReport] = []
        self._backend: _Backend | None = None  # thread mode
        self._processes: _Processes | None = None  # process mode: the generation receiving jobs
        self._live: set[_Worker] = set()  # every worker process not yet reaped, of any generation
        self._reaping: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._problems = ProblemLog(log)
        self._identities: dict[str, dict[str, Any]] = {}
        self._info_labels: dict[str, tuple[str, ...]] = {}
        self._spec_json = spec_to_json(spec)
        # Read at scrape time: no gauge update on the request path.
        metrics.analysis_queue_depth.set_function(lambda: self.in_flight)

    # ---- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> list[TokenizerReport]:
        """Start the workers and load the tokenizers; traffic flows meanwhile (jobs wait in the pipe)."""
        self._loop = asyncio.get_running_loop()
        if self.mode == "thread":
            backend = self._new_backend()
            self._backend = backend
            return await self._load(backend, first=True)
        processes = self._spawn_generation()
        self._processes = processes
        reports = await self._generation_loaded(processes)
        self._apply_reports(reports, first=True)
        return reports

    async def reload(self) -> list[TokenizerReport]:
        """Load the tokenizers again from disk in fresh workers; swap only if every one loaded."""
        if self.mode != "thread":
            return await self._reload_processes()
        backend = self._new_backend()
        try:
            reports = await self._describe(backend)
        except Exception:
            backend.executor.shutdown(wait=False, cancel_futures=True)
            raise
        errors = [r for r in reports if r.error]
        if errors:
            backend.executor.shutdown(wait=False, cancel_futures=True)
            for r in errors:
                log.error("reload: tokenizer for model %s failed to load: %s", r.label, r.error)
            return reports
        old, self._backend = self._backend, backend
        self._apply_reports(reports, first=False)
        if old is not None:
            old.executor.shutdown(wait=False)  # in-flight analyses finish on the old tokenizers
        return reports

    async def close(self) -> None:
        backend, self._backend = self._backend, None
        if backend is not None:
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: backend.executor.shutdown(wait=True, cancel_futures=True)
            )
        processes, self._processes = self._processes, None
        if processes is not None:
            processes.closing = True
        await self._stop_workers(list(self._live))

    def _new_backend(self) -> _Backend:
        pool = ThreadPoolExecutor(self.workers, thread_name_prefix="islwatch-analysis")
        return _Backend(pool)

    async def _describe(self, backend: _Backend) -> list[TokenizerReport]:
        loop = asyncio.get_running_loop()
        try:
            state = await loop.run_in_executor(backend.executor, WorkerState.load, self.spec)
            backend.state = state
        finally:
            backend.loaded.set()  # jobs waiting for the load must not wait forever
        return await loop.run_in_executor(backend.executor, state.describe)

    async def _load(self, backend: _Backend, first: bool) -> list[TokenizerReport]:
        reports = await self._describe(backend)
        self._apply_reports(reports, first=first)
        return reports

    # ---- worker processes ---------------------------------------------------------------------------------

    def _spawn(self, processes: _Processes, index: int, describe: bool) -> _Worker:
        worker = _Worker(self, processes, index)
        worker.start(self._spec_json, describe)
        self._live.add(worker)
        if index < len(processes.workers):
            processes.workers[index] = worker
        else:
            processes.workers.append(worker)
        return worker

    def _spawn_generation(self) -> _Processes:
        processes = _Processes(max(1, self.workers))
        for i in range(processes.count):
            self._spawn(processes, i, describe=i == 0)  # identities and parity: checked once per load
        return processes

    async def _generation_loaded(self, processes: _Processes) -> list[TokenizerReport]:
        """Wait until every worker of the generation has loaded; the first one's reports."""
        workers = list(processes.workers)
        await asyncio.gather(*(w.connected() for w in workers))
        results = await asyncio.gather(*(w.ready for w in workers))
        return results[0] or []

    async def _reload_processes(self) -> list[TokenizerReport]:
        processes = self._spawn_generation()
        try:
            reports = await self._generation_loaded(processes)
        except BaseException:
            processes.closing = True
            await self._stop_workers(processes.workers)
            raise
        errors = [r for r in reports if r.error]
        if errors:
            processes.closing = True
            await self._stop_workers(processes.workers)
            for r in errors:
                log.error("reload: tokenizer for model %s failed to load: %s", r.label, r.error)
            return reports
        old, self._processes = self._processes, processes
        self._apply_reports(reports, first=False)
        if old is not None:
            old.closing = True
            for w in old.workers:
                w.retire()  # in-flight analyses finish on the old tokenizers, then the workers exit
        return reports

    def worker_gone(self, worker: _Worker) -> None:
        """The worker's output ended: it exited. Its unanswered jobs are lost (counted); restart it."""
        if worker.gone:
            return
        worker.gone = True
        if worker.writer is not None and not worker.writer.is_closing():
            worker.writer.abort()
        lost, worker.in_flight = worker.in_flight, 0
        if lost:
            self.in_flight -= lost
            self.metrics.analysis_dropped.inc(lost)
        expected = worker.retiring or worker.generation.closing
        if not worker.ready.done():
            worker.ready.set_exception(RuntimeError("analysis worker exited before loading its tokenizers"))
            worker.ready.exception()  # retrieved here: a reload's gather may not be waiting for it
        task = asyncio.get_running_loop().create_task(self._after_exit(worker, expected, lost))
        self._reaping.add(task)
        task.add_done_callback(self._reaping.discard)

    async def _after_exit(self, worker: _Worker, expected: bool, lost: int) -> None:
        code = await self._reap(worker)
        if expected:
            return
        self.worker_exits += 1
        self.metrics.analysis_worker_exits.inc()
        log.error(
            "analysis worker %d exited unexpectedly (code %s); %d analyses lost; restarting it",
            worker.index, code, lost,
        )  # fmt: skip
        processes = worker.generation
        now = time.monotonic()
        processes.exits = [t for t in processes.exits if now - t < 60.0] + [now]
        # Back off when it keeps dying (a tokenizer that crashes on load, memory limits): 0, 1, 2, 4... 30 s.
        delay = 0.0 if len(processes.exits) <= 1 else min(30.0, 2.0 ** (len(processes.exits) - 2))
        if delay:
            await asyncio.sleep(delay)
        if processes.closing or processes is not self._processes:
            return
        replacement = self._spawn(processes, worker.index, describe=False)
        try:
            await replacement.connected()
        except Exception as exc:
            log.error("analysis worker %d could not be restarted: %s", worker.index, type(exc).__name__)

    async def _reap(self, worker: _Worker, timeout: float = STOP_SECONDS) -> int | None:
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

    async def _stop_workers(self, workers: list[_Worker]) -> None:
        for w in workers:
            if w.writer is None and not w._connecting.done():
                w._connecting.cancel()
            w.retire()
        for w in workers:
            if w.proc is not None and w.writer is None:  # never connected: nothing will close its input
                w.proc.terminate()
        await asyncio.gather(*(self._reap(w) for w in workers), return_exceptions=True)
        for task in list(self._reaping):
            task.cancel()

    # ---- reports ------------------------------------------------------------------------------------------

    def _apply_reports(self, reports: list[TokenizerReport], first: bool) -> None:
        m = self.metrics
        for r in reports:
            if r.error or r.identity is None:
                log.error("tokenizer for model %s failed to load: %s", r.label, r.error)
                continue
            ident = r.identity
            labels = (
                r.label,
                str(ident["name"]),
                str(ident["revision"] or ""),
                str(ident["template_sha256"] or ""),
                str(ident["tokenizer_sha256"]),
                str(ident["transformers_version"]),
            )
            old = self._info_labels.get(r.key)
            if old is not None and old != labels:
                m.tokenizer_info.remove(*old)
            m.tokenizer_info.labels(*labels).set(1)
            self._info_labels[r.key] = labels
            previous = self._identities.get(r.key)
            if previous is not None and previous != ident:
                m.tokenizer_changes.labels(model=r.label).inc()
                log.warning("tokenizer identity changed for model %s on reload", r.label)
            elif previous is None:
                m.tokenizer_changes.labels(model=r.label)  # a zero series, so an increase() alert can fire
            self._identities[r.key] = ident
            if r.parity_ok is not None:
                m.parity_ok.labels(model=r.label).set(1 if r.parity_ok else 0)
            log.log(
                logging.INFO if r.parity_ok is not False else logging.WARNING,
                "tokenizer for model %s: %s (template %s); %s",
                r.label,
                ident["name"],
                (ident["template_sha256"] or "none")[:12],
                r.parity_summary,
            )
        self.reports = reports
        self.ready = all(not r.error for r in reports)

    # ---- the request path ---------------------------------------------------------------------------------

    def submit(self, job: AnalysisJob) -> bool:
        """Queue one analysis without waiting; False (and counted) when dropped."""
        if self.in_flight >= self.queue_max:
            return self._drop("analysis queue full (%d in flight); request not analysed")
        processes = self._processes
        if processes is not None:
            worker = processes.pick()
            if worker is None or worker.writer is None:
                return self._drop("no analysis worker can take a job (%d in flight); request not analysed")
            worker.writer.write(encode_job(job))
            worker.in_flight += 1
            self.in_flight += 1
            return True
        backend = self._backend
        if backend is None:
            return self._drop("analysis not running (%d in flight); request not analysed")
        try:
            if backend.state is not None:
                fut = backend.executor.submit(backend.state.analyze, job)
            else:  # tokenizers still loading: wait for them in the worker thread
                fut = backend.executor.submit(_analyze_when_loaded, backend, job)
        except RuntimeError:  # the executor was shut down under us (a reload or shutdown racing)
            return self._drop("analysis pool shut down (%d in flight); request not analysed")
        self.in_flight += 1
        loop = self._loop
        assert loop is not None
        fut.add_done_callback(lambda f: loop.call_soon_threadsafe(self._thread_finished, f))
        return True

    def _drop(self, message: str) -> bool:
        self.metrics.analysis_dropped.inc()
        self._problems("analysis_dropped", message, self.in_flight, level=logging.INFO)
        return False

    def finished(self, outcome: AnalysisOutcome) -> None:
        self.in_flight -= 1
        apply_outcome(self.metrics, outcome, self._problems)

    def _thread_finished(self, fut: Future[AnalysisOutcome]) -> None:
        try:
            outcome = fut.result()
        except Exception as exc:  # cancelled by a shutdown, or a bug outside analyze's own boundary
            self.in_flight -= 1
            self._problems("analysis_error", "analysis failed: %s", type(exc).__name__, level=logging.ERROR)
            return
        self.finished(outcome)


def _analyze_when_loaded(backend: _Backend, job: AnalysisJob) -> AnalysisOutcome:
    backend.loaded.wait()
    if backend.state is None:
        return AnalysisOutcome(job.endpoint, job.model_label, 0.0, error="tokenizers failed to load")
    return backend.state.analyze(job)


def apply_outcome(m: Metrics, o: AnalysisOutcome, problems: ProblemLog) -> None:
    """Update the metrics for one analysed request (event loop thread only)."""
    m.analysis_seconds.observe(o.seconds)
    model, endpoint = o.model_label, o.endpoint
    if o.error:
        problems("analysis_error", "model %s endpoint %s: %s", model, endpoint, o.error, level=logging.ERROR)
        return
    if o.bad_reason:
        m.child(m.bad_requests, o.bad_reason).inc()
        problems(o.bad_reason, "%s body is not a request of its endpoint (%s)", endpoint, o.detail or "-")
        return
    child = m.child
    if o.bare is not None:
        child(m.isl_tokens, model, endpoint, "bare").observe(o.bare)
    if o.templated is not None:
        child(m.isl_tokens, model, endpoint, "templated").observe(o.templated)
    if o.server is not None:
        child(m.isl_tokens, model, endpoint, "server").observe(o.server)
    if o.fallback_reason:
        child(m.fallback, model, o.fallback_reason).inc()
    if o.match:
        child(m.match, model, endpoint, o.match).inc()
        if o.match == "no_server_count":
            problems(
                "no_server_count",
                "model %s endpoint %s: response carried no usage",
                model,
                endpoint,
                level=logging.DEBUG,
            )
    if o.server is not None and o.expected is not None:
        child(m.drift_tokens, model, endpoint).observe(o.server - o.expected)
    if o.cause:
        child(m.drift, model, endpoint, o.cause).inc()
    if o.duplicate_bos_risk:
        child(m.duplicate_bos_risk, model, endpoint).inc()
