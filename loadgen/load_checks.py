"""Which of the workload-source, arrival, sweep and SLO flags combine; part of LoadgenConfig's validation.

Each problem is a sentence naming the flags, as loadgen/config.py's `contradictions` reports the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loadgen.config import LoadgenConfig

SLO_KEYS = ("ttft_ms", "itl_ms", "e2e_ms")
STREAMED_SLOS = ("ttft_ms", "itl_ms")  # measured on content chunks: only a stream has them


def parse_pairs(text: str) -> dict[str, float]:
    """`ttft_ms=500,e2e_ms=2000` -> {"ttft_ms": 500.0, "e2e_ms": 2000.0} (names are checked later)."""
    out: dict[str, float] = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep:
            raise ValueError(f"expected NAME=VALUE, got {item.strip()!r}")
        out[key.strip()] = float(value)
    return out


def parse_values(text: str) -> list[float]:
    """`1,2,4.5` -> [1.0, 2.0, 4.5]."""
    return [float(v) for v in text.split(",") if v.strip()]


def source_contradictions(c: LoadgenConfig) -> list[str]:
    out = _source(c)
    out += _load_shape(c)
    out += _slo(c)
    return out


def _source(c: LoadgenConfig) -> list[str]:
    out: list[str] = []
    name = "--trace" if c.trace is not None else "--dataset" if c.dataset is not None else None
    if c.dataset is not None and c.trace is not None:
        out.append("give at most one of --dataset or --trace")
    if name is None:
        if not c.isl:
            out.append("--isl is required (unless --dataset or --trace gives the requests)")
        if c.trace_speedup != 1.0 or c.block_size != 512:
            out.append("--trace-speedup and --block-size need --trace")
        return out
    if c.endpoint == "embeddings":
        out.append(f"{name} needs --endpoint chat, completions or responses")
    for given, flag in (
        (c.turns > 1, "--turns"),
        (c.shared_system_prompt_length > 0, "--shared-system-prompt-length"),
        (c.cache_bust.value != "none", "--cache-bust"),
        (c.content_parts, "--content-parts"),
        (c.isl_stddev > 0, "--isl-stddev"),
    ):
        if given:
            out.append(f"{flag} does not apply to {name} (its records are the requests)")
    if c.trace is not None:
        if c.concurrency is not None or c.request_rate is not None:
            out.append("--trace sends at the trace's timestamps: drop --concurrency/--request-rate "
                       "(scale time with --trace-speedup)")  # fmt: skip
        if c.isl:
            out.append("--isl does not apply to --trace (each record's input_length is its ISL)")
        if c.warmup:
            out.append("--warmup does not apply to --trace (it would change what the prefix cache holds)")
    elif c.trace_speedup != 1.0 or c.block_size != 512:
        out.append("--trace-speedup and --block-size need --trace")
    return out


def _load_shape(c: LoadgenConfig) -> list[str]:
    out: list[str] = []
    if c.burstiness != 1.0 and c.arrival != "gamma":
        out.append("--burstiness needs --arrival gamma")
    if c.ramp_to is not None:
        if c.trace is not None or c.sweep:
            out.append("--ramp-to does not combine with --trace or --sweep")
        elif c.concurrency is not None:
            if c.duration is None:
                out.append("--ramp-to with --concurrency needs --duration (users join over time)")
            if c.ramp_to != int(c.ramp_to) or c.ramp_to <= c.concurrency:
                out.append("--ramp-to with --concurrency is a whole number of users above --concurrency")
    if c.sweep is not None:
        if not c.sweep or any(v <= 0 for v in c.sweep):
            out.append("--sweep takes positive values, e.g. --sweep 1,2,4,8")
        elif c.concurrency is not None and any(v != int(v) or v < c.workers for v in c.sweep):
            out.append("--sweep with --concurrency takes whole numbers of users, at least --workers")
    return out


def _slo(c: LoadgenConfig) -> list[str]:
    if c.slo is None:
        return ["--slo-attainment needs --slo"] if c.slo_attainment != 0.9 else []
    out: list[str] = []
    unknown = sorted(set(c.slo) - set(SLO_KEYS))
    if unknown or not c.slo:
        out.append(f"--slo takes {', '.join(SLO_KEYS)} (got {', '.join(unknown) or 'nothing'})")
    if any(v <= 0 for v in c.slo.values()):
        out.append("--slo bounds are positive milliseconds")
    streamed = [k for k in STREAMED_SLOS if k in c.slo]
    if streamed and not c.streaming:
        out.append(f"--slo {', '.join(streamed)} needs --streaming (measured on streamed chunks)")
    return out


AGENT_FLAGS = {"agent_rounds": "--agent-rounds", "tools": "--tools", "parallel_calls": "--parallel-calls",
               "round_isl": "--round-isl"}  # fmt: skip


def agent_contradictions(c: LoadgenConfig) -> list[str]:
    """`--workload agent` (loadgen/workload/agent.py) and the flags that only it reads."""
    if c.workload != "agent":
        # Values, not the fields set: a worker process validates the whole dumped config again.
        fields = type(c).model_fields
        given = [flag for name, flag in AGENT_FLAGS.items() if getattr(c, name) != fields[name].default]
        return [f"{', '.join(given)} need(s) --workload agent"] if given else []
    out = []
    if c.endpoint not in ("chat", "messages"):
        out.append("--workload agent needs --endpoint chat or messages (tool calls and results are messages)")
    if not c.round_isl:
        out.append("--workload agent needs --round-isl (the templated tokens each round adds)")
    if c.parallel_calls > c.tools:
        out.append(f"--parallel-calls {c.parallel_calls} is more than the --tools {c.tools} to call")
    if c.turns not in (1, c.agent_rounds + 1):  # 1: not given; rounds + 1: set by sources.py
        out.append("--workload agent sends --agent-rounds + 1 requests per conversation; leave --turns out")
    for refused, flag in (
        (c.dataset is not None or c.trace is not None, "--dataset or --trace"),
        (c.images > 0, "--images"),
        (c.isl_stddev > 0, "--isl-stddev"),
    ):
        if refused:
            out.append(f"{flag} does not combine with --workload agent")
    return out
