"""Mistral models in vLLM's `mistral` tokenizer mode: the prompt token ids vLLM 0.32 sends to the engine.

vLLM picks that mode by itself for a model folder holding `consolidated*.safetensors` and a `tekken.json` or
`tokenizer.model.v*` (`vllm/tokenizers/registry.py` `resolve_tokenizer_args`), or when started with
`--tokenizer-mode mistral`. Prompts then come from mistral-common, not from a Jinja template: the request
is prepared as core/renderers/mistral_request.py describes, and mistral-common's `ChatCompletionRequest.from_openai`
and `MistralTokenizer.encode_chat_completion` give the ids (transformers' `MistralCommonBackend.
apply_chat_template`, which vLLM's `MistralTokenizer.apply_chat_template` calls). The ids reach the engine
as they are: the request's `add_special_tokens` only applies to text prompts (`vllm/renderers/base.py`
`_tokenize_singleton_prompt` skips a prompt that already has `prompt_token_ids`).

Counting is pure (a loaded tokenizer in, ids out); `is_mistral_folder` and `load_mistral` read the folder,
once, at load. The ids equal vLLM's only with the mistral-common vLLM runs (1.13.1
in vLLM 0.32's environment; vLLM requires >= 1.11.6): `MISTRAL_COMMON` names the one loaded here.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mistral_common
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.protocol.instruct.validator import ValidationMode
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
from mistral_common.tokens.tokenizers.utils import get_one_valid_tokenizer_file

from .mistral_request import MediaNotModelled, mistral_call, refuse

__all__ = [
    "MISTRAL_COMMON",
    "MediaNotModelled",
    "MistralLoadError",
    "MistralRenderer",
    "is_mistral_folder",
    "load_mistral",
    "tokenizer_file",
]

MISTRAL_COMMON = mistral_common.__version__
# vllm/transformers_utils/repo_utils.py is_mistral_model_repo / any_pattern_in_repo_files: each pattern is
# matched (fnmatch) against the base name of every file under the folder, subfolders included.
WEIGHTS_PATTERN = "consolidated*.safetensors"
TOKENIZER_PATTERNS = ("tekken.json", "tokenizer.model.v*")


class MistralLoadError(Exception):
    """The folder has no tokenizer file mistral-common can load (vLLM would fail to start)."""


def _file_names(path: Path) -> list[str]:
    """repo_utils.list_repo_files for a local path: every file under it (`rglob("*")`, `is_file()`)."""
    return [f.name for f in path.rglob("*") if f.is_file()]


def is_mistral_folder(path: Path) -> bool:
    """Whether vLLM's `--tokenizer-mode auto` picks `mistral` for this local folder."""
    if not path.is_dir():
        return False
    names = _file_names(path)

    def has(pattern: str) -> bool:
        return any(fnmatch.fnmatch(name, pattern) for name in names)

    return has(WEIGHTS_PATTERN) and any(has(p) for p in TOKENIZER_PATTERNS)


def tokenizer_file(path: Path) -> Path:
    """The file vLLM loads: transformers' `MistralCommonBackend.from_pretrained` on a folder takes
    mistral-common's `get_one_valid_tokenizer_file(os.listdir(folder))` (`tekken.json` first, else the last
    `*.model.v*` by name; the folder's top level only)."""
    try:
        return path / get_one_valid_tokenizer_file(os.listdir(path))
    except (OSError, ValueError) as exc:
        raise MistralLoadError(f"no mistral-common tokenizer file in {path}: {type(exc).__name__}") from exc


@dataclass(frozen=True)
class MistralRenderer:
    tokenizer: MistralTokenizer[Any, Any, Any, Any, Any]  # mistral-common's, ValidationMode.test as in vLLM
    file: Path

    @property
    def version(self) -> int:
        """tokenizers/mistral.py MistralTokenizer.version: "v7" -> 7 ("v7m1" is a v7 with images)."""
        return int(str(self.tokenizer.instruct_tokenizer.tokenizer.version.value).split("v")[-1])

    @property
    def bos(self) -> int:
        return int(self.tokenizer.instruct_tokenizer.tokenizer.bos_id)

    @property
    def eos(self) -> int:
        return int(self.tokenizer.instruct_tokenizer.tokenizer.eos_id)

    def chat_ids(self, body: Any) -> list[int]:
        """The prompt ids of a chat-completions body. `ServerRefuses` ("vllm answers 400: ...") where vLLM
        answers 400, `InvalidBody` ("vllm answers 500: ...") where it fails, `MediaNotModelled` for a body
        with media parts."""
        call = mistral_call(body)
        # MistralTokenizer.apply_chat_template passes reasoning_effort only to tokenizers >= v15.
        extra = {"reasoning_effort": call.reasoning_effort} if self.version >= 15 else {}
        try:
            request = ChatCompletionRequest.from_openai(
                messages=call.messages,
                tools=call.tools,
                continue_final_message=call.continue_final_message,
                **extra,
            )
            tokens = self.tokenizer.encode_chat_completion(request).tokens
        except Exception as exc:
            # renderers/mistral.py safe_apply_chat_template: whatever mistral-common raises (its own
            # exceptions, assertions, pydantic's, KeyError...) becomes a ValueError, answered 400.
            raise refuse(f"mistral-common refuses the request ({type(exc).__name__})") from exc
        return list(tokens)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """A text prompt (completions): MistralCommonBackend._text_to_ids in test mode, BOS only."""
        return list(
            self.tokenizer.instruct_tokenizer.tokenizer.encode(text, bos=add_special_tokens, eos=False)
        )

    def text_len(self, texts: list[str]) -> int:
        """The bare count: each text encoded alone, without BOS or EOS."""
        raw = self.tokenizer.instruct_tokenizer.tokenizer
        return sum(len(raw.encode(t, bos=False, eos=False)) for t in texts)


def load_mistral(path: Path) -> MistralRenderer:
    """vLLM's MistralTokenizer.from_pretrained on a local folder: mistral-common's `MistralTokenizer.
    from_file(file, mode=ValidationMode.test)` (transformers' `MistralCommonBackend.__init__`)."""
    file = tokenizer_file(path)
    try:
        tokenizer: MistralTokenizer[Any, Any, Any, Any, Any] = MistralTokenizer.from_file(
            str(file), mode=ValidationMode.test
        )
    except Exception as exc:  # mistral-common raises its own, ValueError, AssertionError...: one boundary
        raise MistralLoadError(f"cannot load {file}: {type(exc).__name__}: {exc}") from exc
    return MistralRenderer(tokenizer=tokenizer, file=file)
