"""What crosses from the request path to the analysis workers and back: small frozen records (their wire
form is in frames.py), and the one policy both sides share: which label and tokenizer a model name maps to.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from proxy.core.server_settings import ServerSettings
from proxy.core.usage import Usage, usage_from_json_bytes

# Model label values besides configured model names (bounded cardinality).
DEFAULT_LABEL = "default"  # no --model-tokenizer map: every model is the one served model
OTHER_LABEL = "other"  # a model name the map does not know: many names collapse into this one value
NONE_LABEL = "none"  # a request islwatch does not analyse (other paths, unreadable bodies)
DEFAULT_KEY = ""  # tokenizer key of the default tokenizer (config forbids empty model names)
OTHER_ENDPOINT = "other"


@dataclass(frozen=True)
class ModelRoute:
    label: str
    tokenizer_key: str | None  # None: no tokenizer for this model, count nothing
    unknown: bool  # a name the --model-tokenizer map does not know


def route_model(model: Any, models: frozenset[str], has_default: bool) -> ModelRoute:
    """Label and tokenizer for the request's `model` (docs/proxy.md, "Models and labels")."""
    if isinstance(model, str) and model in models:
        return ModelRoute(model, model, False)
    default_key = DEFAULT_KEY if has_default else None
    if not models:
        return ModelRoute(DEFAULT_LABEL, default_key, False)
    return ModelRoute(OTHER_LABEL, default_key, True)


@dataclass(frozen=True)
class AnalysisSpec:
    """What a worker needs to load its state; plain values, so it crosses to a worker process as JSON."""

    tokenizers: tuple[tuple[str, str], ...]  # (key, spec); key DEFAULT_KEY is the default tokenizer
    chat_template: str | None = None
    trust_remote_code: bool = False
    dump_dir: str | None = None
    dump_max: int = 100
    server_flavor: str = "vllm"
    mm_processor_kwargs: dict[str, Any] | None = None  # the server's --mm-processor-kwargs (image counts)
    trust_request_mm_kwargs: bool = False  # the server runs with --trust-request-mm-kwargs
    default_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # ServerSettings
    harmony_start_date: str | None = None  # ServerSettings
    tokenizer_mode: str = "auto"  # ServerSettings
    reasoning_parser: str = "auto"  # ServerSettings
    nice: int = 0  # added to a worker process's niceness once loaded: analysis yields a busy CPU to the relay

    def to_json(self) -> str:
        return orjson.dumps(asdict(self)).decode()

    def settings(self) -> ServerSettings:
        return ServerSettings(
            dict(self.default_chat_template_kwargs),
            self.harmony_start_date,
            self.tokenizer_mode,
            self.reasoning_parser,
        )

    @classmethod
    def from_json(cls, text: str) -> AnalysisSpec:
        fields = orjson.loads(text)
        fields["tokenizers"] = tuple((str(k), str(v)) for k, v in fields["tokenizers"])
        return cls(**fields)


@dataclass(frozen=True)
class AnalysisJob:
    """One relayed request to analyse. Raw bytes travel to worker processes (cheaper than pickling a
    parsed body); in thread mode the body the handler already parsed rides along in `parsed`."""

    endpoint: str
    model_label: str
    tokenizer_key: str
    body: bytes
    parsed: Any = None
    server_tokens: int | None = None  # from the SSE parser on the response path
    server_usage: Usage | None = None  # the whole usage that parser read (server_tokens is its prompt count)
    response_json: bytes | None = None  # a JSON response (or its top-level usage) for the worker to read
    streamed: bool = False  # the response was an event stream
    memo_key: str | None = None  # memo.py: the outcome is kept under this key (echoed by the worker)

    def usage(self) -> Usage | None:
        """The server's usage: read on the response path for a stream, else from the kept JSON answer."""
        if self.server_usage is not None or self.response_json is None:
            return self.server_usage
        return usage_from_json_bytes(self.response_json)

    def server_count(self, usage: Usage | None) -> int | None:
        """The server's prompt count, given `usage()`."""
        if self.server_tokens is not None:
            return self.server_tokens
        return usage.input_tokens if usage is not None else None


@dataclass(frozen=True)
class AnalysisOutcome:
    """Everything the main process needs to update the metrics for one analysed request."""

    endpoint: str
    model_label: str
    seconds: float
    bare: int | None = None
    templated: int | None = None
    expected: int | None = None
    server: int | None = None
    match: str | None = None  # exact | mismatch | no_server_count | no_template; None: not counted
    cause: str | None = None  # drift cause, when a server count is known
    fallback_reason: str | None = None
    bad_reason: str | None = None  # e.g. not_a_request
    detail: str | None = None  # content-free
    duplicate_bos_risk: bool = False
    error: str | None = None  # the worker could not analyse (no tokenizer loaded, internal error)
    # The rest of the server's usage (`server` is its prompt count); None: the field was not reported.
    output_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    # Set when `error` is an islwatch bug: the stage that raised (metrics.ANALYSIS_STAGES); `detail`: frames.
    error_stage: str | None = None
    # The request's image parts by outcome (proxy.core.images.IMAGE_OUTCOMES); None: no images.
    images: dict[str, int] | None = None
    image_tokens: int | None = None  # the tokens of all its images, when every one was counted
    memo_key: str | None = None  # the job's (memo.py)


@dataclass(frozen=True)
class TokenizerReport:
    """Result of loading one tokenizer in a worker: identity for the info metric, the parity self-check."""

    key: str
    label: str
    identity: dict[str, Any] | None
    parity_ok: bool | None  # None: not checked (reports of workers that did not run the self-check)
    parity_summary: str
    error: str | None = None
    # The server parity probe (core/probe.py): [name, text] pairs and islwatch's ids for each text.
    probes: list[list[str]] | None = None
    probe_ids: list[list[int]] | None = None
    # The chat probe (core/probe_set.py chat_probe): [messages, islwatch's ids, [[kwargs, ids], ...]].
    chat_probe: list[Any] | None = None
    # Why fast.py's shortcuts are off for this tokenizer (core.fallbacks.FALLBACK_REASONS): slower, same counts.
    fast_path_fallbacks: list[str] | None = None

    def as_row(self) -> list[Any]:
        return [self.key, self.label, self.identity, self.parity_ok, self.parity_summary, self.error,
                self.probes, self.probe_ids, self.chat_probe, self.fast_path_fallbacks]  # fmt: skip

    @classmethod
    def from_row(cls, row: list[Any]) -> TokenizerReport:
        return cls(*row)
