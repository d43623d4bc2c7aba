"""Load generator configuration: one pydantic model, validated before any request is sent."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from proxy.core.endpoints import SHAPES, Endpoint
from proxy.core.specs import DEFAULT_TOKENIZER

from .markers import CacheBust


class LoadgenConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = Field(description="base URL of the server or islwatch proxy, e.g. http://127.0.0.1:9000")
    model: str = "default"
    tokenizer: str = DEFAULT_TOKENIZER
    endpoint: Literal["chat", "completions", "embeddings"] = "chat"
    isl: int = Field(ge=1)
    isl_stddev: float = Field(default=0.0, ge=0)
    osl: int = Field(default=128, ge=1)
    turns: int = Field(default=1, ge=1)
    shared_system_prompt_length: int = Field(default=0, ge=0)
    cache_bust: CacheBust = CacheBust.NONE
    content_parts: bool = False  # send user content as a list of text parts
    concurrency: int | None = Field(default=None, ge=1)
    request_rate: float | None = Field(default=None, gt=0)
    arrival: Literal["poisson", "constant"] = "poisson"
    request_count: int | None = Field(default=None, ge=1)
    duration: float | None = Field(default=None, gt=0)
    warmup: int = Field(default=0, ge=0)
    streaming: bool = False
    ignore_eos: bool = False
    seed: int = 0
    workers: int = Field(default=1, ge=1)
    timeout_seconds: float = Field(default=600.0, gt=0)
    api_key: str | None = None
    proxy_metrics_url: str | None = None
    output: Path | None = None
    records: Path | None = None
    run_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])

    @model_validator(mode="after")
    def _no_contradictions(self) -> LoadgenConfig:
        problems = contradictions(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def endpoint_url(self) -> str:
        base = self.url.rstrip("/")
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        return base + SHAPES[Endpoint(self.endpoint)].path


def contradictions(c: LoadgenConfig) -> list[str]:
    """Every combination that cannot mean what the user asked for, each as a sentence."""
    out: list[str] = []
    if (c.concurrency is None) == (c.request_rate is None):
        out.append("give exactly one of --concurrency (closed loop) or --request-rate (open loop)")
    if (c.request_count is None) == (c.duration is None):
        out.append("give exactly one of --request-count or --duration")
    if c.endpoint != "chat":
        if c.cache_bust is not CacheBust.NONE:
            out.append(f"--cache-bust needs --endpoint chat (a {c.endpoint} prompt has no turns to mark)")
        if c.turns > 1:
            out.append(f"--turns > 1 needs --endpoint chat ({c.endpoint} requests carry no history)")
        if c.shared_system_prompt_length:
            out.append(
                f"--shared-system-prompt-length needs --endpoint chat ({c.endpoint} has no system role)"
            )
        if c.content_parts:
            out.append("--content-parts needs --endpoint chat")
    if c.endpoint == "embeddings" and c.streaming:
        out.append("--streaming does not apply to embeddings")
    if c.shared_system_prompt_length and c.shared_system_prompt_length >= c.isl:
        out.append(
            f"--shared-system-prompt-length {c.shared_system_prompt_length} leaves no room in --isl {c.isl}: "
            "the first request's templated count (system prompt included) is the ISL"
        )
    if c.request_count is not None and c.request_count < c.workers:
        out.append(f"--request-count {c.request_count} is smaller than --workers {c.workers}")
    if c.concurrency is not None and c.concurrency < c.workers:
        out.append(f"--concurrency {c.concurrency} is smaller than --workers {c.workers}")
    if c.isl_stddev and c.isl_stddev >= c.isl:
        out.append("--isl-stddev must be smaller than --isl")
    return out
