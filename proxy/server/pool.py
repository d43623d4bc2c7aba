"""The bounded analysis pool: counting happens here, off the response path, and never delays traffic.

`submit(job)` is synchronous and cheap (called from the handler's `finally`): when `analysis_queue` analyses
are already in flight the job is dropped and counted (`islwatch_analysis_dropped_total`), so a slow
tokenizer can only lose measurements, never add latency. The work runs in a backend: worker processes by
default (processes.py: tokenization and Jinja rendering hold the GIL, a process uses the second core and
leaves the event loop alone), or threads (threads.py). Each backend generation loads its tokenizers once;
a reload starts a new generation and swaps it in only when every tokenizer loaded.

`problem()` is what /readyz reports: the pool is ready only while every tokenizer is loaded AND a worker
runs with them (`islwatch_analysis_workers_live` > 0), so a crashed or crash-looping worker is never
reported as measuring. A restarted worker's reports are applied like a load's: its identities are compared
(a change counts in `islwatch_tokenizer_changes_total`, updates `islwatch_tokenizer_info`, and is listed
by `changed_on_restart` until the next successful reload brings every worker onto it).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Protocol

from proxy.server.memo import DEFAULT_ENTRIES, OutcomeMemo
from proxy.server.metrics import Metrics
from proxy.server.problems import ProblemLog
from proxy.server.processes import Processes, WorkerExited
from proxy.server.records import AnalysisJob, AnalysisOutcome, AnalysisSpec, TokenizerReport

log = logging.getLogger("islwatch.analysis")


class Backend(Protocol):
    async def start(self) -> list[TokenizerReport]: ...
    def submit(self, job: AnalysisJob) -> bool: ...
    def retire(self) -> None: ...
    async def close(self) -> None: ...
    def pids(self) -> list[int]: ...
    @property
    def live(self) -> int: ...
    @property
    def loaded(self) -> int: ...
    @property
    def trouble(self) -> str | None: ...


class AnalysisPool:
    def __init__(
        self,
        spec: AnalysisSpec,
        metrics: Metrics,
        mode: str = "process",
        workers: int = 1,
        queue_max: int = 256,
        memo_entries: int = DEFAULT_ENTRIES,
    ) -> None:
        self.spec = spec
        self.metrics = metrics
        self.mode = mode
        self.workers = workers
        self.queue_max = queue_max
        self.memo = OutcomeMemo(memo_entries)  # a repeated body with the same server count: no worker trip
        self.in_flight = 0
        self.worker_exits = 0  # worker processes that died unexpectedly (each restarted; logged)
        self.reports: list[TokenizerReport] = []
        self.changed_on_restart: set[str] = set()  # model labels whose identity a worker restart changed
        self._start_error: str | None = None  # why the first load failed (before any report)
        self._has_loaded = False  # a load (start, restart or reload) has reported
        self._backend: Backend | None = None  # the generation receiving jobs
        self._retired: list[Backend] = []  # older generations finishing their queue
        self._problems = ProblemLog(log)
        self._on_loaded: list[Callable[[], None]] = []
        # Read at scrape time: no gauge update on the request path.
        metrics.analysis_queue_depth.set_function(lambda: self.in_flight)
        metrics.analysis_workers_live.set_function(lambda: self.workers_loaded)

    # ---- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> list[TokenizerReport]:
        """Start the workers and load the tokenizers; traffic flows meanwhile (jobs wait for the load)."""
        backend = self._backend = self._new_backend()
        try:
            reports = await backend.start()
        except WorkerExited as exc:  # a crash while loading: the worker is restarted (backing off)
            self._start_error = f"{exc}; restarting it"
            raise
        except Exception as exc:
            self._start_error = f"analysis failed to start: {type(exc).__name__}"
            raise
        self._loaded(reports)
        return reports

    async def reload(self) -> list[TokenizerReport]:
        """Load the tokenizers again from disk in a fresh generation; swap only if every one loaded."""
        backend = self._new_backend()
        try:
            reports = await backend.start()
        except BaseException:  # e.g. WorkerExited: the current generation keeps serving
            await backend.close()
            raise
        errors = [r for r in reports if r.error]
        if errors:
            await backend.close()
            for r in errors:
                log.error("reload: tokenizer for model %s failed to load: %s", r.label, r.error)
            return reports
        old, self._backend = self._backend, backend
        self.changed_on_restart.clear()  # every worker now runs what is on disk
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

    @property
    def workers_loaded(self) -> int:
        """Workers taking jobs now: running, with their tokenizers loaded (threads count in thread mode)."""
        return self._backend.loaded if self._backend is not None else 0

    @property
    def ready(self) -> bool:
        return self.problem() is None

    def problem(self) -> tuple[str, str] | None:
        """Why the pool is not measuring now, as (status, content-free reason); None while it is."""
        backend = self._backend
        if not self._has_loaded:
            if self._start_error is None:
                return "loading", "loading tokenizers"
            return "error", (backend.trouble if backend is not None else None) or self._start_error
        failed = [r.label for r in self.reports if r.error]
        if failed:
            return "error", "tokenizer failed to load for model " + ", ".join(failed)
        if backend is None or not backend.loaded:
            trouble = backend.trouble if backend is not None else None
            return "no_live_worker", trouble or "analysis not running"
        return None

    def _new_backend(self) -> Backend:
        if self.mode == "thread":
            # Imported here: threads.py loads the analyzer (transformers), which the event-loop process of
            # process-mode analysis never needs (its workers report tokenizer identities over the pipe).
            from proxy.server.threads import Threads

            return Threads(self.spec, self.workers, self.finished, self._failed)
        spec_json = self.spec.to_json()
        return Processes(spec_json, self.workers, self.finished, self._lost, self._exited, self._restarted)

    def on_loaded(self, callback: Callable[[], None]) -> None:
        """Call `callback` after every load that swapped tokenizers in (start and each successful reload)."""
        self._on_loaded.append(callback)

    def _loaded(self, reports: list[TokenizerReport]) -> None:
        self.memo.new_generation()  # outcomes counted with what was loaded before are not reused
        self.metrics.tokenizers_loaded(reports)  # compares each identity with the last one loaded
        self.reports = reports
        self._start_error, self._has_loaded = None, True
        for callback in self._on_loaded:
            callback()

    def _restarted(self, backend: Processes, reports: list[TokenizerReport]) -> None:
        """A restarted worker of `backend` loaded the tokenizers from disk again: report and compare."""
        if backend is not self._backend:
            return  # a retiring generation's worker: the current one's reports stand
        before = {r.key: r.identity for r in self.reports}
        changed = {r.label for r in reports if before.get(r.key) not in (None, r.identity) and r.identity}
        if changed:
            self.changed_on_restart |= changed
            log.warning(
                "a restarted analysis worker loaded another tokenizer for model %s than the pool started "
                "with (changed on disk); reload to run it in every worker",
                ", ".join(sorted(changed)),
            )
        self._loaded(reports)

    # ---- the request path ---------------------------------------------------------------------------------

    def submit(self, job: AnalysisJob) -> bool:
        """Queue one analysis without waiting (or apply a reusable one, memo.py); False (and counted) when
        dropped."""
        key = self.memo.key(job)
        if key is not None:
            if (reuse := self.memo.reuse(key, job)) is not None:
                plan = self.metrics.reapplied(reuse.kept, reuse.plan, reuse.usage, self._problems)
                if plan is not reuse.plan:  # made anew (the server parity verdict changed): kept instead
                    self.memo.keep(reuse.kept, plan)
                return True
            job = dataclasses.replace(job, memo_key=key)
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
        if (plan := self.metrics.analysed(outcome, self._problems)) is not None:
            self.memo.keep(outcome, plan)

    def _failed(self, exc: BaseException) -> None:
        self.in_flight -= 1
        self._problems("analysis_error", "analysis failed: %s", type(exc).__name__, level=logging.ERROR)

    def _lost(self, n: int) -> None:
        self.in_flight -= n
        self.metrics.dropped(n)

    def _exited(self) -> None:
        self.worker_exits += 1
        self.metrics.worker_exited()
