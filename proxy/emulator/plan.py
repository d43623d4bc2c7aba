"""One request planned before any byte is written, and the per-app emulator state that plans it.

Planning refuses what vLLM refuses (bad JSON, unknown model in strict mode, `n` above 1, a bad output cap,
anything `counting` refuses) with `RequestError`, so a planned request always answers in full.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.endpoints import ANTHROPIC, SHAPES, Endpoint
from proxy.core.tokenizer import LoadedTokenizer
from proxy.emulator.config import PREFIX_BLOCK, EmulatorConfig
from proxy.emulator.counting import (
    anthropic_as_chat,
    chat_prompt_ids,
    chat_prompt_tokens,
    pick_word,
    prompt_token_counts,
)
from proxy.emulator.errors import RequestError

__all__ = [
    "Emulator",
    "EmulatorConfig",
    "EmulatorStats",
    "Plan",
    "RequestError",
    "parse_body",
    "request_digest",
]


@dataclass
class EmulatorStats:
    """What reached the emulator; tests of the proxy read it (also served at GET /emulator/stats)."""

    requests: int = 0
    streams_started: int = 0
    streams_completed: int = 0
    streams_reset: int = 0  # cut by the reset-mid-stream fault
    client_disconnects: int = 0  # the client (or proxy) went away mid-stream
    status_faults: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Plan:
    endpoint: Endpoint
    model: str
    rid: str
    created: int
    prompts: tuple[int, ...]  # prompt_tokens per prompt (one for chat / responses)
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    body: dict[str, Any]
    cached: int | None = None  # prompt tokens served from the prefix cache (`--prefix-cache`; None: off)

    @property
    def prompt_tokens(self) -> int:
        return sum(self.prompts)

    @property
    def completion_tokens(self) -> int:
        if self.endpoint in (Endpoint.EMBEDDINGS, Endpoint.COUNT_TOKENS):
            return 0
        return self.max_tokens * len(self.prompts)


def request_digest(body: dict[str, Any]) -> str:
    """The id part of a response: derived from the body, so the same request gets the same id and answers
    are reproducible. stream_options is left out, so a proxy that injects include_usage sees the same id."""
    stable = {k: v for k, v in body.items() if k != "stream_options"}
    return hashlib.sha256(orjson.dumps(stable, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise RequestError("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise RequestError("request body is not a JSON object")
    return body


def _unwrap(loaded: LoadedTokenizer | Any) -> Any:
    return loaded.tokenizer if isinstance(loaded, LoadedTokenizer) else loaded


class Emulator:
    """Per-app state: the tokenizer (loaded once), the answer word, the seeded fault RNGs, counters.

    `enc` encodes prompts (counting and `/tokenize`): the `tokenizer=SPEC` fault's tokenizer when given,
    else `tok`. `tok` always renders the chat template and picks the answer word."""

    def __init__(
        self, config: EmulatorConfig, loaded: LoadedTokenizer | Any, encoder: LoadedTokenizer | Any = None
    ) -> None:
        self.config = config
        self.tok = _unwrap(loaded)
        self.enc = self.tok if encoder is None else _unwrap(encoder)
        self.word = pick_word(self.tok)
        # One RNG per fault, so switching one fault on does not move the other's decisions.
        self.status_rng = random.Random(f"{config.seed}:status")
        self.reset_rng = random.Random(f"{config.seed}:reset")
        self.stats = EmulatorStats()
        self.blocks: set[bytes] = set()  # the prefix cache: chained hashes of the whole blocks seen

    def cached_prefix(self, ids: list[int]) -> int:
        """Tokens of `ids` served from the prefix cache, which then holds their blocks too. As vLLM's block
        pool: whole blocks only, chained hashes (a block is a hit only after the same blocks before it), and
        never the last token (it is always computed)."""
        hit, chained, counting = 0, b"", True
        for start in range(0, len(ids) - PREFIX_BLOCK + 1, PREFIX_BLOCK):
            block = orjson.dumps(ids[start : start + PREFIX_BLOCK])
            chained = hashlib.sha256(chained + block).digest()
            if counting and chained in self.blocks:
                hit += PREFIX_BLOCK
            else:
                counting = False
                self.blocks.add(chained)
        return min(hit, (len(ids) - 1) // PREFIX_BLOCK * PREFIX_BLOCK)

    def created(self) -> int:
        return int(time.time()) if self.config.created is None else self.config.created

    def draw_status(self) -> int | None:
        f = self.config.faults
        if f.status is not None and self.status_rng.random() < f.status_rate:
            return f.status
        return None

    def draw_reset(self) -> bool:
        rate = self.config.faults.reset_rate
        return rate > 0 and self.reset_rng.random() < rate

    def text(self, n: int) -> str:
        return " ".join([self.word] * n)

    def pieces(self, n: int) -> Iterator[str]:
        """The answer one token at a time; the pieces join to `text(n)`."""
        for i in range(n):
            yield self.word if i == 0 else " " + self.word

    def max_tokens(self, endpoint: Endpoint, body: dict[str, Any]) -> int:
        """The output cap: the endpoint's first cap field present (chat: the newer name first)."""
        for name in SHAPES[endpoint].max_tokens_fields:
            value = body.get(name)
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise RequestError(f"{name} must be an integer of at least 1", param=name)
            if value > self.config.max_tokens_limit:
                raise RequestError(f"{name} is above {self.config.max_tokens_limit}", param=name)
            return value
        return self.config.default_max_tokens

    def prompt_counts(self, endpoint: Endpoint, body: dict[str, Any]) -> tuple[int, ...]:
        """prompt_tokens per prompt; embeddings with `messages` are vLLM's chat-style embeddings."""
        if endpoint == Endpoint.COMPLETIONS:
            return prompt_token_counts(self.enc, body, "prompt")
        if endpoint == Endpoint.EMBEDDINGS and not isinstance(body.get("messages"), list):
            return prompt_token_counts(self.enc, body, "input")
        return (chat_prompt_tokens(self.tok, endpoint, body, self.config.faults, self.enc),)

    def check_model(self, body: dict[str, Any]) -> None:
        """vLLM's 404 for a model it does not serve (only with `strict_models`)."""
        model = body.get("model")
        if self.config.strict_models and model is not None and model not in self.config.served_models:
            raise RequestError(f"The model `{model}` does not exist.", status=404, param="model")

    def plan(self, endpoint: Endpoint, raw: bytes) -> Plan:
        body = parse_body(raw)
        self.check_model(body)
        model = body.get("model")
        served = self.config.served_models
        if body.get("n") not in (None, 1):
            raise RequestError("the emulator answers n=1 only", param="n")
        cached = None
        if endpoint in ANTHROPIC:
            ids = chat_prompt_ids(
                self.tok, anthropic_as_chat(self.tok, endpoint, body), self.config.faults, self.enc
            )
            prompts: tuple[int, ...] = (len(ids),)
            if endpoint == Endpoint.MESSAGES and self.config.prefix_cache:
                cached = self.cached_prefix(ids)
        else:
            prompts = self.prompt_counts(endpoint, body)
        raw_options = body.get("stream_options")
        options: dict[str, Any] = raw_options if isinstance(raw_options, dict) else {}
        shape = SHAPES[endpoint]
        return Plan(
            endpoint=endpoint,
            model=model if isinstance(model, str) else served[0],
            rid=shape.id_prefix + request_digest(body),
            created=self.created(),
            prompts=prompts,
            max_tokens=self.max_tokens(endpoint, body),
            stream=bool(body.get("stream", False)) and shape.streams,
            include_usage=bool(options.get("include_usage")),
            continuous_usage=bool(options.get("continuous_usage_stats")),
            body=body,
            cached=cached,
        )
