"""The bounded analysis pool: counting happens here, off the response path, and never delays traffic.

`submit(job)` is synchronous and cheap (called from the handler's `finally`): when `analysis_queue` analyses
are already in flight the job is dropped and counted (`islwatch_analysis_dropped_total`), so a slow
tokenizer can only lose measurements, never add latency. The work runs in a backend: worker processes by
default (processes.py: tokenization and Jinja rendering hold the GIL, a process uses the second core and
leaves the event loop alone), or threads (threads.py). Each backend generation loads its tokenizers once;
a reload starts a new generation and swaps it in only when every tokenizer loaded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from proxy.server.analyzer import AnalysisSpec
from proxy.server.metrics import Metrics
from proxy.server.problems import ProblemLog
from proxy.server.processes import Processes
from proxy.server.records import AnalysisJob, AnalysisOutcome, TokenizerReport
from proxy.server.threads import Threads

log = logging.getLogger("islwatch.analysis")


class Backend(Protocol):
    async def start(self) -> list[TokenizerReport]: ...
    def submit(self, job: AnalysisJob) -> bool: ...
    def retire(self) -> None: ...
    async def close(self) -> None: ...
    def pids(self) -> list[int]: ...
    @property
    def live(self) -> int: ...


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
        self._backend: Backend | None = None  # the generation receiving jobs
        self._retired: list[Backend] = []  # older generations finishing their queue
        self._problems = ProblemLog(log)
        self._on_loaded: list[Callable[[], None]] = []
        # Read at scrape time: no gauge update on the request path.
        metrics.analysis_queue_depth.set_function(lambda: self.in_flight)

    # ---- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> list[TokenizerReport]:
        """Start the workers and load the tokenizers; traffic flows meanwhile (jobs wait for the load)."""
        backend = self._backend = self._new_backend()
        reports = await backend.start()
        self._loaded(reports)
        return reports

    async def reload(self) -> list[TokenizerReport]:
        """Load the tokenizers again from disk in a fresh generation; swap only if every one loaded."""
        backend = self._new_backend()
        try:
            reports = await backend.start()
        except BaseException:
            await backend.close()
            raise
        errors = [r for r in reports if r.error]
        if errors:
            await backend.close()
            for r in errors:
                log.error("reload: tokenizer for model %s failed to load: %s", r.label, r.error)
            return reports
        old, self._backend = self._backend, backend
        self._loaded(reports)
        if old is not None:
            old.retire()  # in-flight analyses finish on the old tokenizers, then its workers exit
            self._retired = [b for b in self._retired if b.live] + [old]
        return reports

    async def close(self) -> None:
        backends = [b for b in (self._backend, *self._retired) if b is not None]
        self._backend, self._retired = None, []
        for backend in backends:
            await backend.close()

    def worker_pids(self) -> list[int]:
        """The worker processes receiving jobs now (empty in thread mode)."""
        return self._backend.pids() if self._backend is not None else []

    @property
    def live_workers(self) -> int:
        """Worker processes of any generation not yet reaped."""
        return sum(b.live for b in (self._backend, *self._retired) if b is not None)

    def _new_backend(self) -> Backend:
        if self.mode == "thread":
            return Threads(self.spec, self.workers, self.finished, self._failed)
        return Processes(self.spec.to_json(), self.workers, self.finished, self._lost, self._exited)

    def on_loaded(self, callback: Callable[[], None]) -> None:
        """Call `callback` after every load that swapped tokenizers in (start and each successful reload)."""
        self._on_loaded.append(callback)

    def _loaded(self, reports: list[TokenizerReport]) -> None:
        self.metrics.tokenizers_loaded(reports)
        self.reports = reports
        self.ready = all(not r.error for r in reports)
        for callback in self._on_loaded:
            callback()

    # ---- the request path ---------------------------------------------------------------------------------

    def submit(self, job: AnalysisJob) -> bool:
        """Queue one analysis without waiting; False (and counted) when dropped."""
        if self.in_flight >= self.queue_max:
            return self._drop("analysis queue full (%d in flight); request not analysed")
        backend = self._backend
        if backend is None:
            return self._drop("analysis not running (%d in flight); request not analysed")
        if not backend.submit(job):
            return self._drop("no analysis worker can take a job (%d in flight); request not analysed")
        self.in_flight += 1
        return True

    def _drop(self, message: str) -> bool:
        self.metrics.dropped()
        self._problems("analysis_dropped", message, self.in_flight, level=logging.INFO)
        return False

    # ---- backend callbacks (event loop thread) ------------------------------------------------------------

    def finished(self, outcome: AnalysisOutcome) -> None:
        self.in_flight -= 1
        self.metrics.analysed(outcome, self._problems)

    def _failed(self, exc: BaseException) -> None:
        self.in_flight -= 1
        self._problems("analysis_error", "analysis failed: %s", type(exc).__name__, level=logging.ERROR)

    def _lost(self, n: int) -> None:
        self.in_flight -= n
        self.metrics.dropped(n)

    def _exited(self) -> None:
        self.worker_exits += 1
        self.metrics.worker_exited()
