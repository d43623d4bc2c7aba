"""Load generator configuration: one pydantic model, validated before any request is sent."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from loadgen.load_checks import agent_contradictions, source_contradictions
from loadgen.workload.markers import CacheBust
from proxy.core.endpoints import SHAPES, Endpoint
from proxy.core.specs import DEFAULT_TOKENIZER


class LoadgenConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = Field(description="base URL of the server or islwatch proxy, e.g. http://127.0.0.1:9000")
    model: str = "default"
    tokenizer: str = DEFAULT_TOKENIZER
    endpoint: Literal["chat", "completions", "embeddings", "responses", "messages"] = "chat"
    isl: int = Field(default=0, ge=0)  # 0: not given (a dataset's own counts, a trace's input_length)
    isl_stddev: float = Field(default=0.0, ge=0)
    osl: int = Field(default=128, ge=1)
    turns: int = Field(default=1, ge=1)
    shared_system_prompt_length: int = Field(default=0, ge=0)
    cache_bust: CacheBust = CacheBust.NONE
    content_parts: bool = False  # send user content as a list of text parts
    # Generated PNGs in the first user message (loadgen/workload/images.py), counted in the budget by the server's
    # image rule under its --mm-processor-kwargs.
    images: int = Field(default=0, ge=0)
    image_size: str = Field(default="448x448", pattern=r"^[1-9][0-9]*[xX][1-9][0-9]*$")
    mm_processor_kwargs: dict[str, Any] | None = None
    # `--workload agent` (loadgen/workload/agent.py): system + user + rounds of reasoning, tool calls, results.
    workload: Literal["conversation", "agent"] = "conversation"
    agent_rounds: int = Field(default=3, ge=1)
    tools: int = Field(default=4, ge=1)
    parallel_calls: int = Field(default=2, ge=1)
    round_isl: int = Field(default=0, ge=0)
    server_flavor: Literal["vllm", "sglang", "llama.cpp"] = "vllm"  # whose counting the budget follows
    concurrency: int | None = Field(default=None, ge=1)
    request_rate: float | None = Field(default=None, gt=0)
    arrival: Literal["poisson", "constant", "gamma"] = "poisson"
    burstiness: float = Field(default=1.0, gt=0)  # gamma shape (vLLM's --burstiness)
    ramp_to: float | None = Field(default=None, gt=0)  # linear ramp of the rate or concurrency to this
    request_count: int | None = Field(default=None, ge=1)
    duration: float | None = Field(default=None, gt=0)
    warmup: int = Field(default=0, ge=0)
    streaming: bool = False
    ignore_eos: bool = False
    seed: int = 0
    workers: int = Field(default=1, ge=1)
    # `--shard I/N`: this client is part I of a run of N clients (loadgen/shards.py says how they split it).
    shard: str | None = Field(default=None, pattern=r"^[0-9]+/[1-9][0-9]*$")
    timeout_seconds: float = Field(default=600.0, gt=0)
    api_key: str | None = None
    proxy_metrics_url: str | None = None
    output: Path | None = None
    records: Path | None = None
    run_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    run_dir: Path | None = None  # records, setup and clock of this shard, for `islwatch loadgen merge`
    # Workload sources, SLOs, sweeps and extra reports (loadgen/load_checks.py says what combines).
    dataset: Path | None = None
    trace: Path | None = None
    trace_speedup: float = Field(default=1.0, gt=0)
    block_size: int = Field(default=512, ge=1)
    corpus: Path | None = None
    slo: dict[str, float] | None = None
    slo_attainment: float = Field(default=0.9, gt=0, le=1)
    sweep: list[float] | None = None
    html: Path | None = None
    csv: Path | None = None

    @model_validator(mode="after")
    def _no_contradictions(self) -> LoadgenConfig:
        problems = contradictions(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def shard_index(self) -> int:
        return int(self.shard.split("/")[0]) if self.shard else 0

    @property
    def shard_count(self) -> int:
        return int(self.shard.split("/")[1]) if self.shard else 1

    @property
    def senders(self) -> int:
        """Sending processes in the whole run: every shard's --workers."""
        return self.shard_count * self.workers

    @property
    def endpoint_url(self) -> str:
        base = self.url.rstrip("/")
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        return base + SHAPES[Endpoint(self.endpoint)].path


def contradictions(c: LoadgenConfig) -> list[str]:
    """Every combination that cannot mean what the user asked for, each as a sentence."""
    out = source_contradictions(c)  # datasets, traces, arrivals, ramps, sweeps, SLOs
    out += agent_contradictions(c)
    if c.trace is None and (c.concurrency is None) == (c.request_rate is None):
        out.append("give exactly one of --concurrency (closed loop) or --request-rate (open loop)")
    sourced = c.dataset is not None or c.trace is not None  # neither: one pass over the file
    if (c.request_count is None) == (c.duration is None) and not (sourced and c.request_count is None):
        out.append("give exactly one of --request-count or --duration")
    if c.endpoint not in ("chat", "responses", "messages"):
        if c.cache_bust is not CacheBust.NONE:
            out.append(f"--cache-bust needs --endpoint chat (a {c.endpoint} prompt has no turns to mark)")
        if c.turns > 1:
            out.append(f"--turns > 1 needs --endpoint chat ({c.endpoint} requests carry no history)")
        if c.shared_system_prompt_length:
            out.append(
                f"--shared-system-prompt-length needs --endpoint chat ({c.endpoint} has no system role)"
            )
    if c.images and (c.endpoint != "chat" or c.dataset is not None or c.trace is not None):
        out.append("--images needs --endpoint chat and generated requests (no --dataset or --trace)")
    if c.content_parts and c.endpoint not in ("chat", "messages"):
        out.append("--content-parts needs --endpoint chat or messages")
    if c.endpoint == "messages" and c.ignore_eos:
        out.append("--ignore-eos does not apply to --endpoint messages (the Messages API has no ignore_eos)")
    if c.endpoint == "embeddings" and c.streaming:
        out.append("--streaming does not apply to embeddings")
    if c.isl and c.shared_system_prompt_length and c.shared_system_prompt_length >= c.isl:
        out.append(
            f"--shared-system-prompt-length {c.shared_system_prompt_length} leaves no room in --isl {c.isl}: "
            "the first request's templated count (system prompt included) is the ISL"
        )
    senders = f"--workers {c.workers}" if c.shard is None else f"{c.senders} senders (shards x --workers)"
    if c.request_count is not None and c.request_count < c.senders:
        out.append(f"--request-count {c.request_count} is smaller than {senders}")
    if c.concurrency is not None and c.concurrency < c.senders:
        out.append(f"--concurrency {c.concurrency} is smaller than {senders}")
    out += shard_contradictions(c)
    if c.isl_stddev and c.isl_stddev >= c.isl:
        out.append("--isl-stddev must be smaller than --isl")
    return out


def shard_contradictions(c: LoadgenConfig) -> list[str]:
    out = []
    if c.run_dir is not None and c.sweep:
        out.append("--run-dir holds one run's records, not a --sweep's")
    if c.shard is None:
        return out
    if c.shard_index >= c.shard_count:
        out.append(f"--shard {c.shard}: the index counts from 0 to {c.shard_count - 1}")
    if "run_id" not in c.model_fields_set:
        out.append("--shard needs --run-id: every shard marks and names the same run")
    if c.sweep:
        out.append("--shard sends one run, not a --sweep")
    return out
