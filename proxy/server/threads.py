"""The thread backend of the analysis pool: analysis in a thread pool of this process.

No start-up cost, but it shares the event loop's core (tokenization holds the GIL), so processes are the
default. Jobs carry the body the handler already parsed, so nothing is parsed twice. Outcomes are handed
back to the event loop thread, the only place metrics are updated. The jobs waiting in the executor's queue
are bounded by their raw bytes (body and kept response), as a worker process's pipe backlog is
(`MAX_PENDING_BYTES`): above it a job is refused (the pool counts it dropped), whatever the count.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from proxy.server.analyzer import AnalysisSpec, Analyzer
from proxy.server.processes import MAX_PENDING_BYTES
from proxy.server.records import AnalysisJob, AnalysisOutcome, TokenizerReport


def job_bytes(job: AnalysisJob) -> int:
    """The raw bytes a queued job holds (the parsed body rides along, a few times that in objects)."""
    return len(job.body) + (len(job.response_json) if job.response_json is not None else 0)


class Threads:
    """One generation of analysis threads sharing one `Analyzer` (loaded once, in a pool thread)."""

    def __init__(
        self,
        spec: AnalysisSpec,
        count: int,
        on_outcome: Callable[[AnalysisOutcome], None],
        on_failure: Callable[[BaseException], None],
    ) -> None:
        self.spec = spec
        self.count = max(1, count)
        self.executor = ThreadPoolExecutor(self.count, thread_name_prefix="islwatch-analysis")
        self.on_outcome = on_outcome
        self.on_failure = on_failure  # the analysis raised past its own boundary (a shutdown, a bug)
        self.analyzer: Analyzer | None = None
        self.pending_bytes = 0  # raw bytes of the jobs submitted and not finished
        self.failure: str | None = None  # why the analyzer did not load
        self._stopped = False
        self._loaded = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> list[TokenizerReport]:
        loop = self._loop = asyncio.get_running_loop()
        try:
            self.analyzer = await loop.run_in_executor(self.executor, Analyzer.load, self.spec)
        except Exception as exc:
            self.failure = f"analysis failed to load: {type(exc).__name__}"
            raise
        finally:
            self._loaded.set()  # jobs waiting for the load must not wait forever
        return await loop.run_in_executor(self.executor, self.analyzer.describe)

    def submit(self, job: AnalysisJob) -> bool:
        size = job_bytes(job)
        if self.pending_bytes and self.pending_bytes + size > MAX_PENDING_BYTES:
            return False  # bounded by bytes: one job alone may exceed it, never the queue
        try:
            fut = self.executor.submit(self._analyze, job)
        except RuntimeError:  # the executor was shut down under us (a reload or shutdown racing)
            return False
        self.pending_bytes += size
        loop = self._loop
        assert loop is not None
        fut.add_done_callback(lambda f: loop.call_soon_threadsafe(self._finished, f, size))
        return True

    @property
    def live(self) -> int:
        return 0  # no processes

    @property
    def loaded(self) -> int:
        return self.count if self.analyzer is not None and not self._stopped else 0

    @property
    def trouble(self) -> str | None:
        if self.loaded:
            return None
        return "analysis threads stopped" if self._stopped else self.failure or "analysis threads loading"

    def pids(self) -> list[int]:
        return []

    def retire(self) -> None:
        self._stopped = True
        self.executor.shutdown(wait=False)  # in-flight analyses finish on the old tokenizers

    async def close(self) -> None:
        self._stopped = True
        executor = self.executor
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: executor.shutdown(wait=True, cancel_futures=True)
        )

    def _analyze(self, job: AnalysisJob) -> AnalysisOutcome:
        self._loaded.wait()  # a job submitted while the tokenizers load waits for them, in its thread
        if self.analyzer is None:
            return AnalysisOutcome(job.endpoint, job.model_label, 0.0, error="tokenizers failed to load")
        return self.analyzer.analyze(job)

    def _finished(self, fut: Future[AnalysisOutcome], size: int) -> None:
        self.pending_bytes -= size
        try:
            outcome = fut.result()
        except BaseException as exc:  # cancelled by a shutdown, or a bug outside analyze's own boundary
            self.on_failure(exc)
            return
        self.on_outcome(outcome)
