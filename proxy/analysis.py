"""The bounded analysis pool: counting happens here, off the response path, and never delays traffic.

`submit(job)` is synchronous and cheap (called from the handler's `finally`): when `analysis_queue` analyses
are already in flight the job is dropped and counted (`islwatch_analysis_dropped_total`), so a slow
tokenizer can only lose measurements, never add latency. Workers are processes by default (tokenization
and Jinja rendering hold the GIL; a process uses the second core and leaves the event loop alone), threads
as an option (no start-up cost, shares the loop's core). Each worker loads its tokenizers once.

Outcomes come back to the event loop thread, which is the only place metrics are updated.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import threading
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from .metrics import Metrics
from .records import AnalysisJob, AnalysisOutcome, ProblemLog, TokenizerReport
from .worker import AnalysisSpec, WorkerState, analyze_in_process, describe_in_process, init_process

log = logging.getLogger("islwatch.analysis")


class _Backend:
    """One generation of workers. Thread mode: the state the threads share, set once loaded."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.state: WorkerState | None = None
        self.loaded = threading.Event()


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
        self.ready = False
        self.reports: list[TokenizerReport] = []
        self._backend: _Backend | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._problems = ProblemLog(log)
        self._restarting = False
        self._identities: dict[str, dict[str, Any]] = {}
        self._info_labels: dict[str, tuple[str, ...]] = {}

    # ---- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> list[TokenizerReport]:
        """Start the workers and load the tokenizers; traffic flows meanwhile (jobs wait in the executor)."""
        self._loop = asyncio.get_running_loop()
        backend = self._new_backend()
        self._backend = backend
        return await self._load(backend, first=True)

    async def reload(self) -> list[TokenizerReport]:
        """Load the tokenizers again from disk in fresh workers; swap only if every one loaded."""
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

    def _new_backend(self) -> _Backend:
        if self.mode == "thread":
            pool = ThreadPoolExecutor(self.workers, thread_name_prefix="islwatch-analysis")
            return _Backend(pool)
        # spawn, not fork: the parent runs an event loop and threads, which fork would copy half-way.
        ctx = multiprocessing.get_context("spawn")
        executor = ProcessPoolExecutor(
            self.workers, mp_context=ctx, initializer=init_process, initargs=(self.spec,)
        )
        return _Backend(executor)

    async def _describe(self, backend: _Backend) -> list[TokenizerReport]:
        loop = asyncio.get_running_loop()
        if self.mode == "thread":
            try:
                state = await loop.run_in_executor(backend.executor, WorkerState.load, self.spec)
                backend.state = state
            finally:
                backend.loaded.set()  # jobs waiting for the load must not wait forever
            return await loop.run_in_executor(backend.executor, state.describe)
        return await loop.run_in_executor(backend.executor, describe_in_process)

    async def _load(self, backend: _Backend, first: bool) -> list[TokenizerReport]:
        reports = await self._describe(backend)
        self._apply_reports(reports, first=first)
        return reports

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
        backend = self._backend
        if backend is None or self.in_flight >= self.queue_max:
            self.metrics.analysis_dropped.inc()
            self._problems(
                "analysis_dropped",
                "analysis queue full (%d in flight); request not analysed",
                self.in_flight,
                level=logging.INFO,
            )
            return False
        try:
            if backend.state is not None:
                fut = backend.executor.submit(backend.state.analyze, job)
            elif self.mode == "thread":  # tokenizers still loading: wait for them in the worker thread
                fut = backend.executor.submit(_analyze_when_loaded, backend, job)
            else:
                fut = backend.executor.submit(analyze_in_process, job)
        except (BrokenProcessPool, RuntimeError) as exc:
            self.metrics.analysis_dropped.inc()
            self._problems(
                "analysis_pool_broken",
                "analysis pool unavailable (%s); restarting it",
                type(exc).__name__,
                level=logging.ERROR,
            )
            self._schedule_restart()
            return False
        self.in_flight += 1
        self.metrics.analysis_queue_depth.set(self.in_flight)
        loop = self._loop
        assert loop is not None
        fut.add_done_callback(lambda f: loop.call_soon_threadsafe(self._finished, f))
        return True

    def _finished(self, fut: Future[AnalysisOutcome]) -> None:
        self.in_flight -= 1
        self.metrics.analysis_queue_depth.set(self.in_flight)
        try:
            outcome = fut.result()
        except Exception as exc:  # a worker died or the pool was shut down under the job
            self._problems("analysis_error", "analysis failed: %s", type(exc).__name__, level=logging.ERROR)
            if isinstance(exc, BrokenProcessPool):
                self._schedule_restart()
            return
        apply_outcome(self.metrics, outcome, self._problems)

    def _schedule_restart(self) -> None:
        if self._restarting or self._loop is None:
            return
        self._restarting = True

        async def restart() -> None:
            try:
                await self.reload()
            finally:
                self._restarting = False

        self._loop.create_task(restart())


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
        m.bad_requests.labels(reason=o.bad_reason).inc()
        problems(o.bad_reason, "%s body is not a request of its endpoint (%s)", endpoint, o.detail or "-")
        return
    for kind, value in (("bare", o.bare), ("templated", o.templated), ("server", o.server)):
        if value is not None:
            m.isl_tokens.labels(model=model, endpoint=endpoint, kind=kind).observe(value)
    if o.fallback_reason:
        m.fallback.labels(model=model, reason=o.fallback_reason).inc()
    if o.match:
        m.match.labels(model=model, endpoint=endpoint, result=o.match).inc()
        if o.match == "no_server_count":
            problems(
                "no_server_count",
                "model %s endpoint %s: response carried no usage",
                model,
                endpoint,
                level=logging.DEBUG,
            )
    if o.server is not None and o.expected is not None:
        m.drift_tokens.labels(model=model, endpoint=endpoint).observe(o.server - o.expected)
    if o.cause:
        m.drift.labels(model=model, endpoint=endpoint, cause=o.cause).inc()
    if o.duplicate_bos_risk:
        m.duplicate_bos_risk.labels(model=model, endpoint=endpoint).inc()
