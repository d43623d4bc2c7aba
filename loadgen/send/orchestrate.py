"""Run one loadgen config end to end: tokenizer, preflight, sending (in-process or N worker processes),
progress, proxy metrics before and after, report. Used by `islwatch loadgen` and `islwatch demo`."""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from proxy.core.tokenizer import LoadedTokenizer, load_tokenizer
from proxy.server.loop import run as run_loop

from . import proxymetrics
from .config import LoadgenConfig
from .goodput import goodput
from .report import LoadgenReport, Overheads, build_report
from .runner import Engine, Record
from .sources import build_workload
from .workload import Workload


@dataclass(frozen=True)
class Prepared:
    loaded: LoadedTokenizer
    workload: Workload
    overhead: Overheads
    cfg: LoadgenConfig  # with the request count a dataset or trace settles (loadgen/sources.py)


def prepare(cfg: LoadgenConfig, loaded: LoadedTokenizer | None = None) -> Prepared:
    """Load the tokenizer and build one request before anything is sent. Raises ValueError / TokenizerLoadError,
    OSError (an unreadable --dataset, --trace or --corpus)."""
    loaded = loaded or load_tokenizer(cfg.tokenizer)
    cfg, workload = build_workload(loaded.tokenizer, cfg)
    workload.preflight()
    o = workload.overhead()
    return Prepared(loaded, workload, Overheads(fixed=o.fixed, wrap=o.wrap, marker=o.marker), cfg)


# The progress bar moves every TICK_EVERY answers: a rich update takes its lock and re-renders the task, which
# at 4,000 req/s on the sending loop was ~2 % of its CPU (py-spy, bench.loadgen_capacity).
TICK_EVERY = 50


def _worker_main(
    cfg_data: dict[str, Any], index: int, n: int, done: Any, ready: Any, go: Any, out: Any
) -> None:
    cfg = LoadgenConfig.model_validate(cfg_data)
    cfg, workload = build_workload(load_tokenizer(cfg.tokenizer).tokenizer, cfg)

    def on_done(_: Record) -> None:
        with done.get_lock():
            done.value += 1

    def wait_go() -> None:
        with ready.get_lock():
            ready.value += 1
        go.wait()

    engine = Engine(cfg, workload, worker=index, workers=n, on_done=on_done)
    out.put((index, run_loop(engine.run(ready=wait_go))))


def send_all(cfg: LoadgenConfig, prepared: Prepared, tick: Callable[[int], None]) -> list[Record]:
    """All records of the run. `tick(done)` is called as measured requests finish."""
    if cfg.workers == 1:
        count = 0

        def on_done(_: Record) -> None:
            nonlocal count
            count += 1
            if count % TICK_EVERY == 0:
                tick(count)

        records = run_loop(Engine(cfg, prepared.workload, on_done=on_done).run())
        tick(count)
        return records
    ctx = mp.get_context("spawn")  # fresh interpreters: no forked event loop or tokenizer threads
    done, ready, go, out = ctx.Value("i", 0), ctx.Value("i", 0), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker_main,
            args=(cfg.model_dump(mode="json"), i, cfg.workers, done, ready, go, out),
            daemon=True,
        )
        for i in range(cfg.workers)
    ]
    for p in procs:
        p.start()
    results: dict[int, list[Record]] = {}
    try:
        while len(results) < len(procs):
            if ready.value == len(procs):
                go.set()  # every worker has built its schedule: start together
            tick(done.value)
            try:
                index, records = out.get(timeout=0.1)
                results[index] = records
            except queue.Empty:
                if not any(p.is_alive() for p in procs) and out.empty():
                    break
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
    tick(done.value)
    return [r for i in sorted(results) for r in results[i]]


def expected_requests(cfg: LoadgenConfig) -> int | None:
    if cfg.request_count is not None:
        return cfg.request_count
    if cfg.request_rate is not None and cfg.duration is not None:
        return int(cfg.request_rate * cfg.duration)
    return None


def settled_proxy_counts(
    url: str, before: proxymetrics.Counts, sent: int, wait_s: float = 10.0
) -> proxymetrics.Counts | None:
    """The proxy's counts for this run. It analyses off the response path, so the last requests' results
    arrive a little after their responses: poll until it has a match result for every request we sent."""
    deadline = time.monotonic() + wait_s
    delta = None
    while True:
        after = proxymetrics.scrape(url)
        if after is not None:
            delta = proxymetrics.diff(before, after)
            analysed = sum(delta.get("islwatch_isl_match_total", {}).values())
            dropped = sum(delta.get("islwatch_analysis_dropped_total", {}).values())
            if analysed + dropped >= sent:
                return delta
        if time.monotonic() > deadline:
            return delta
        time.sleep(0.1)


def run_config(
    cfg: LoadgenConfig, prepared: Prepared, console: Console
) -> tuple[list[Record], LoadgenReport]:
    before = proxymetrics.scrape(cfg.proxy_metrics_url) if cfg.proxy_metrics_url else None
    total = expected_requests(cfg)
    progress = Progress(
        TextColumn("[bold]loadgen"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    with progress:
        task = progress.add_task("requests", total=total)
        records = send_all(cfg, prepared, lambda n: progress.update(task, completed=n))
    proxy = None
    if cfg.proxy_metrics_url and before is not None:
        sent = sum(1 for r in records if r.status is not None)
        proxy = settled_proxy_counts(cfg.proxy_metrics_url, before, sent)
    report = build_report(
        records,
        run_id=cfg.run_id,
        config=cfg.model_dump(mode="json", exclude={"api_key"}),
        tokenizer=prepared.loaded.identity.as_dict(),
        overhead=prepared.overhead,
        proxy=proxy,
    )
    if cfg.slo:
        report = report.model_copy(update={"goodput": goodput(records, cfg.slo, report.duration_s)})
    return records, report
