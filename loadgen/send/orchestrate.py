"""Run one loadgen config end to end: tokenizer, preflight, sending (in-process or N worker processes),
progress, proxy metrics before and after, report. Used by `islwatch loadgen` and `islwatch demo`."""

from __future__ import annotations

import multiprocessing as mp
import queue
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from loadgen.config import LoadgenConfig
from loadgen.report.goodput import goodput
from loadgen.report.model import LoadgenReport, Overheads, build_report
from loadgen.send import proxy_metrics
from loadgen.send.runner import Engine, Record
from loadgen.shards import shard_senders, shard_share
from loadgen.workload.conversations import Workload
from loadgen.workload.mistral_text import load_loadgen_tokenizer
from loadgen.workload.sources import build_workload
from proxy.core.tokenizer import LoadedTokenizer
from proxy.runtime.loop import run as run_loop


@dataclass(frozen=True)
class Prepared:
    loaded: LoadedTokenizer
    workload: Workload
    overhead: Overheads
    cfg: LoadgenConfig  # with the request count a dataset or trace settles (loadgen/workload/sources.py)


def prepare(cfg: LoadgenConfig, loaded: LoadedTokenizer | None = None) -> Prepared:
    """Load the tokenizer and build one request before anything is sent. Raises ValueError / TokenizerLoadError,
    OSError (an unreadable --dataset, --trace or --corpus)."""
    loaded = loaded or load_loadgen_tokenizer(cfg)
    cfg, workload = build_workload(loaded.tokenizer, cfg, loaded)
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
    loaded = load_loadgen_tokenizer(cfg)
    cfg, workload = build_workload(loaded.tokenizer, cfg, loaded)

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
    # A shard's workers are senders shard*workers .. shard*workers + workers - 1 of the whole run's; so N
    # shards of W workers send exactly what one client of N*W workers would (loadgen/shards.py).
    first = shard_senders(cfg.shard_index, cfg.shard_count, cfg.workers).start
    if cfg.workers == 1:
        count = 0

        def on_done(_: Record) -> None:
            nonlocal count
            count += 1
            if count % TICK_EVERY == 0:
                tick(count)

        engine = Engine(cfg, prepared.workload, worker=first, workers=cfg.senders, on_done=on_done)
        records = run_loop(engine.run())
        tick(count)
        return records
    ctx = mp.get_context("spawn")  # fresh interpreters: no forked event loop or tokenizer threads
    done, ready, go, out = ctx.Value("i", 0), ctx.Value("i", 0), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker_main,
            args=(cfg.model_dump(mode="json"), first + i, cfg.senders, done, ready, go, out),
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
    """The requests this client sends (a shard: its part), or None when only the run's end tells."""
    total = None
    if cfg.request_count is not None:
        total = cfg.request_count
    elif cfg.request_rate is not None and cfg.duration is not None:
        total = int(cfg.request_rate * cfg.duration)
    if total is None or cfg.shard is None:
        return total
    return shard_share(total, cfg.shard_index, cfg.shard_count, cfg.workers)


def run_config(
    cfg: LoadgenConfig, prepared: Prepared, console: Console
) -> tuple[list[Record], LoadgenReport]:
    before = proxy_metrics.scrape(cfg.proxy_metrics_url) if cfg.proxy_metrics_url else None
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
        delta = proxy_metrics.settled(cfg.proxy_metrics_url, before, sent)
        proxy = proxy_metrics.nonzero(delta) if delta is not None else None
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
