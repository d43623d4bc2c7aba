"""Where a run's requests come from: synthetic prompts, a dataset or a trace. Reads the file (once per
process) and settles how many requests a run without --request-count/--duration sends: one pass over it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadgen.config import LoadgenConfig
from loadgen.workload.agent import AgentWorkload
from loadgen.workload.conversations import Workload
from loadgen.workload.dataset import DatasetWorkload, load_dataset
from loadgen.workload.mistral_text import MistralText
from loadgen.workload.trace import TraceWorkload, load_trace, records_within
from proxy.core.flavors import flavor_named
from proxy.core.model import load_served_model
from proxy.core.renderers import JINJA
from proxy.core.server_settings import DEFAULT_SETTINGS
from proxy.core.templates import PROCESSOR_FILES
from proxy.core.tokenizer import LoadedTokenizer


def build_workload(
    tok: Any, cfg: LoadgenConfig, loaded: LoadedTokenizer | None = None
) -> tuple[LoadgenConfig, Workload]:
    """The workload, and the config with its request count settled (idempotent: workers call it again).
    `loaded`: the load `tok` came from, reused where the workload counts through the served model."""
    if loaded is not None and loaded.tokenizer is not tok:  # a MistralText is no transformers load
        loaded = None
    messages = cfg.endpoint == "messages"  # counted as the server converts it: through the served model
    if cfg.dataset is not None:
        records = load_dataset(cfg.dataset)
        if cfg.endpoint == "completions" and any(r.prompt is None for r in records):
            raise ValueError(f"--dataset {cfg.dataset}: messages records need --endpoint chat or responses")
        if cfg.request_count is None and cfg.duration is None:
            cfg = cfg.model_copy(update={"request_count": len(records)})
        served = served_model(
            cfg, loaded
        )  # agent records: reasoning and tool calls as the flavor renders them
        return cfg, DatasetWorkload(tok, cfg, records, served=served)
    if cfg.trace is not None:
        trace = load_trace(cfg.trace)
        within = records_within(trace, cfg.trace_speedup, cfg.duration)
        n = min(within, cfg.request_count or within)
        if n < cfg.senders:
            raise ValueError(f"--trace sends {n} request(s) here, fewer than its {cfg.senders} sender(s)")
        cfg = cfg.model_copy(update={"request_count": n, "duration": None})
        return cfg, TraceWorkload(tok, cfg, trace, served=served_model(cfg, loaded) if messages else None)
    if cfg.workload == "agent":
        # Always the served model: its fast encoder counts a long conversation from cached renders (qwen3,
        # 4,400 tokens: 3.5 ms a count against 57 ms on the reference path), and a round takes ~5 counts.
        served = load_served_model(cfg.tokenizer, cfg.server_flavor, loaded=loaded)
        cfg = cfg.model_copy(update={"turns": cfg.agent_rounds + 1})  # the first request, then each round
        return cfg, AgentWorkload(tok, cfg, served=served)
    # Chat turns count through the Jinja template on `tok`, unless mistral-common renders them (`tok` is
    # then only its text encoder, loadgen/workload/mistral_text.py) or they go as Messages requests.
    served = served_model(cfg, loaded) if isinstance(tok, MistralText) or messages else None
    return cfg, Workload(tok, cfg, served=served)


def served_model(cfg: LoadgenConfig, loaded: LoadedTokenizer | None = None) -> Any:
    """The tokenizer as `--server-flavor`'s server serves it (core/model.py), where that differs from the
    Jinja template on `tok` that the workloads count with by default (vLLM's own path for a plain tokenizer
    folder): Harmony (gpt-oss), mistral-common, a processor's template, another flavor, and always for
    `--endpoint messages` (the server's conversion of a Messages request). None: `tok` counts."""
    folder = Path(cfg.tokenizer)
    flavor = flavor_named(cfg.server_flavor)
    if folder.is_dir():
        plain = flavor.renderer(folder, DEFAULT_SETTINGS) == JINJA and not any(
            (folder / name).is_file() for name in PROCESSOR_FILES
        )
    else:
        plain = True  # a hub id or builtin: no model folder to read a renderer from
    if plain and cfg.server_flavor == "vllm" and cfg.endpoint != "messages":
        return None
    return load_served_model(cfg.tokenizer, cfg.server_flavor, loaded=loaded)
