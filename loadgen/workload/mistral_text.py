"""The loadgen's tokenizer for a model folder vLLM serves in its `mistral` tokenizer mode (a `tekken.json` or
`tokenizer.model.v*` file and no transformers tokenizer: core/renderers/mistral.py).

The workloads count whole requests through the served model (core/model.py: mistral-common renders them);
of a tokenizer they only encode plain text: one-token words for the corpus, a shared system prompt's bare
length. `MistralText` is that much of a transformers tokenizer, over mistral-common's own encoder.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from loadgen.config import LoadgenConfig
from proxy.core.flavors import flavor_named
from proxy.core.renderers import MISTRAL
from proxy.core.renderers.mistral import MistralLoadError, MistralRenderer, load_mistral
from proxy.core.server_settings import DEFAULT_SETTINGS
from proxy.core.tokenizer import LoadedTokenizer, TokenizerLoadError, load_mistral_identity, load_tokenizer


class MistralText:
    """`tok(text or texts, add_special_tokens=...)["input_ids"]`, as a transformers tokenizer answers it: BOS
    with special tokens, never EOS (mistral-common's encode, as vLLM's mistral mode encodes a text prompt)."""

    def __init__(self, mistral: MistralRenderer) -> None:
        self.mistral = mistral

    def __call__(self, text: str | list[str], add_special_tokens: bool = True) -> dict[str, Any]:
        if isinstance(text, str):
            return {"input_ids": self.mistral.encode(text, add_special_tokens)}
        return {"input_ids": [self.mistral.encode(t, add_special_tokens) for t in text]}


def serves_mistral(cfg: LoadgenConfig) -> bool:
    """Whether `--server-flavor`'s server renders `--tokenizer` with mistral-common (a local folder only)."""
    folder = Path(cfg.tokenizer)
    return folder.is_dir() and flavor_named(cfg.server_flavor).renderer(folder, DEFAULT_SETTINGS) == MISTRAL


def load_loadgen_tokenizer(cfg: LoadgenConfig) -> LoadedTokenizer:
    """The tokenizer the workloads encode text with: `MistralText` where the server renders with
    mistral-common, else the transformers tokenizer. Raises TokenizerLoadError."""
    if not serves_mistral(cfg):
        return load_tokenizer(cfg.tokenizer)
    folder = Path(cfg.tokenizer)
    try:
        mistral = load_mistral(folder)
    except MistralLoadError as exc:
        raise TokenizerLoadError(str(exc)) from exc
    identity = replace(load_mistral_identity(folder, mistral.file), renderer=MISTRAL)
    return LoadedTokenizer(MistralText(mistral), identity)
