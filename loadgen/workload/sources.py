"""Where a run's requests come from: synthetic prompts, a dataset or a trace. Reads the file (once per
process) and settles how many requests a run without --request-count/--duration sends: one pass over it."""

from __future__ import annotations

from typing import Any

from loadgen.config import LoadgenConfig
from loadgen.workload.conversations import Workload
from loadgen.workload.dataset import DatasetWorkload, load_dataset
from loadgen.workload.trace import TraceWorkload, load_trace, records_within


def build_workload(tok: Any, cfg: LoadgenConfig) -> tuple[LoadgenConfig, Workload]:
    """The workload, and the config with its request count settled (idempotent: workers call it again)."""
    if cfg.dataset is not None:
        records = load_dataset(cfg.dataset)
        if cfg.endpoint == "completions" and any(r.prompt is None for r in records):
            raise ValueError(f"--dataset {cfg.dataset}: messages records need --endpoint chat or responses")
        if cfg.request_count is None and cfg.duration is None:
            cfg = cfg.model_copy(update={"request_count": len(records)})
        return cfg, DatasetWorkload(tok, cfg, records)
    if cfg.trace is not None:
        trace = load_trace(cfg.trace)
        within = records_within(trace, cfg.trace_speedup, cfg.duration)
        n = min(within, cfg.request_count or within)
        if n < cfg.senders:
            raise ValueError(f"--trace sends {n} request(s) here, fewer than its {cfg.senders} sender(s)")
        cfg = cfg.model_copy(update={"request_count": n, "duration": None})
        return cfg, TraceWorkload(tok, cfg, trace)
    return cfg, Workload(tok, cfg)
