"""What one emulator app is told, and the defaults. Light imports only (no aiohttp, no transformers), so
`islwatch emulate --help` shows the defaults without loading a tokenizer library."""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.core.specs import DEFAULT_TOKENIZER
from proxy.emulator.faults import Faults

PREFIX_BLOCK = 16  # vLLM's default --block-size on CPU and GPU
DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's completions default; used for every endpoint here
# A fixed `created` keeps responses byte-for-byte reproducible (the proxy's byte-identity tests rely on it).
FIXED_CREATED = 1_700_000_000


@dataclass(frozen=True)
class EmulatorConfig:
    """Everything one emulator app needs. `models` empty: the tokenizer spec is the model name, as in vLLM."""

    tokenizer: str = DEFAULT_TOKENIZER
    models: tuple[str, ...] = ()
    chat_template: str | None = None  # file overriding the tokenizer's template
    faults: Faults = field(default_factory=Faults)
    seed: int = 0
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    max_tokens_limit: int = 1_000_000
    # vLLM answers 404 for a model it does not serve; off by default so proxy tests can send any name.
    strict_models: bool = False
    embedding_dim: int = 8
    max_model_len: int = 4096  # reported by POST /tokenize, as vLLM reports its context length
    created: int | None = FIXED_CREATED  # None: wall clock
    # vLLM's automatic prefix caching with --enable-prompt-tokens-details: a request's leading whole blocks of
    # PREFIX_BLOCK tokens seen before are cache hits; the Messages API subtracts them from input_tokens.
    prefix_cache: bool = False

    @property
    def served_models(self) -> tuple[str, ...]:
        return self.models or (self.tokenizer,)
