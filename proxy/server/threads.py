"""The thread backend of the analysis pool: analysis in a thread pool of this process.

No start-up cost, but it shares the event loop's core (tokenization holds the GIL), so processes are the
default. Jobs carry the body the handler already parsed, so nothing is parsed twice. Outcomes are handed
back to the event loop thread, the only place metrics are updated.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from proxy.server.analyzer import AnalysisSpec, Analyzer
from proxy.server.records import AnalysisJob, AnalysisOutcome, TokenizerReport


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
        self.executor = ThreadPoolExecutor(max(1, count), thread_name_prefix="islwatch-analysis")
        self.on_outcome = on_outcome
        self.on_failure = on_failure  # the analysis raised past its own boundary (a shutdown, a bug)
        self.analyzer: Analyzer | None = None
        self._loaded = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> list[TokenizerReport]:
        loop = self._loop = asyncio.get_running_loop()
        try:
            self.analyzer = await loop.run_in_executor(self.executor, Analyzer.load, self.spec)
        finally:
            self._loaded.set()  # jobs waiting for the load must not wait forever
        return await loop.run_in_executor(self.executor, self.analyzer.describe)

    def submit(self, job: AnalysisJob) -> bool:
        try:
            fut = self.executor.submit(self._analyze, job)
        except RuntimeError:  # the executor was shut down under us (a reload or shutdown racing)
            return False
        loop = self._loop
        assert loop is not None
        fut.add_done_callback(lambda f: loop.call_soon_threadsafe(self._finished, f))
        return True

    @property
    def live(self) -> int:
        return 0  # no processes

    def pids(self) -> list[int]:
        return []

    def retire(self) -> None:
        self.executor.shutdown(wait=False)  # in-flight analyses finish on the old tokenizers

    async def close(self) -> None:
        executor = self.executor
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: executor.shutdown(wait=True, cancel_futures=True)
        )

    def _analyze(self, job: AnalysisJob) -> AnalysisOutcome:
        self._loaded.wait()  # a job submitted while the tokenizers load waits for them, in its thread
        if self.analyzer is None:
            return AnalysisOutcome(job.endpoint, job.model_label, 0.0, error="tokenizers failed to load")
        return self.analyzer.analyze(job)

    def _finished(self, fut: Future[AnalysisOutcome]) -> None:
        try:
            outcome = fut.result()
        except BaseException as exc:  # cancelled by a shutdown, or a bug outside analyze's own boundary
            self.on_failure(exc)
            return
        self.on_outcome(outcome)
