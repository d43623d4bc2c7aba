"""What a server was started with that changes its prompt counts: the flags islwatch must be told about.

Plain values (they cross to the analysis workers as JSON). Each field names the server flag it mirrors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The `--reasoning-parser` values islwatch models (SGLang's qwen3, deepseek-r1 and gpt-oss parsers), with
# "auto" (the model's documented parser) and "none".
REASONING_PARSERS = ("auto", "none", "qwen3", "deepseek-r1", "gpt-oss")


@dataclass(frozen=True)
class ServerSettings:
    # vLLM's `--default-chat-template-kwargs` (SGLang's flag of the same name): merged under each request's
    # own `chat_template_kwargs` (`vllm/renderers/params.py` `ChatParams.with_defaults`).
    default_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # The date vLLM writes into a gpt-oss (Harmony) system message, YYYY-MM-DD: `VLLM_SYSTEM_START_DATE`, else
    # the server's clock (`harmony_utils.get_system_message`). None: today's UTC date, read per request.
    harmony_start_date: str | None = None
    # vLLM's `--tokenizer-mode`: "auto" serves a folder with consolidated weights and a tekken.json or
    # tokenizer.model.v* through mistral-common (`vllm/tokenizers/registry.py`); "mistral" always does;
    # "hf" never does.
    tokenizer_mode: str = "auto"
    # SGLang's `--reasoning-parser`, which decides how its Messages API hands past thinking to the template
    # (core/flavors/sglang_messages.py): "auto" takes the one SGLang's docs give for the model's template,
    # "none" a server started without one.
    reasoning_parser: str = "auto"
    # vLLM's request-model refusals (a null user content, tool-call arguments that are not a string, an
    # unknown reasoning_effort, a request chat template...): off for llama-server, which checks otherwise.
    vllm_refusals: bool = True
    # vLLM's chat preparation drops the first line of a system text that starts with Claude Code's
    # `x-anthropic-billing-header` (its value changes per request); llama-server keeps it (core/messages.py).
    strip_billing_header: bool = True


DEFAULT_SETTINGS = ServerSettings()
