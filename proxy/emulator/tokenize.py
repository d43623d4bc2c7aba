"""`POST /tokenize` as vLLM 0.32 answers it (`vllm/entrypoints/serve/tokenize/protocol.py`).

Two request shapes: TokenizeCompletionRequest, `{"prompt": str, "add_special_tokens": true}` (its default),
and TokenizeChatRequest, `{"messages": [...], "add_generation_prompt": true, "continue_final_message":
false, "add_special_tokens": false}`, rendered through the emulator's counting path (`counting.chat_ids`).
Both answer TokenizeResponse, `{"count", "max_model_len", "tokens", "token_strs"}` (`token_strs` null
unless `return_token_strs`). Ids come from the emulator's encoder, so the `tokenizer=SPEC` fault shows
here as it would on a server whose tokenizer changed. A body neither shape accepts raises `RequestError`.
"""

from __future__ import annotations

from typing import Any

from proxy.core.tokens import encode
from proxy.emulator.counting import chat_ids
from proxy.emulator.errors import RequestError
from proxy.emulator.plan import Emulator, parse_body


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"{name} must be a boolean", param=name)
    return value


def tokenize_ids(emu: Emulator, body: dict[str, Any]) -> list[int]:
    """The ids vLLM's /tokenize returns for this body."""
    if "prompt" in body:
        prompt = body["prompt"]
        if not isinstance(prompt, str):
            raise RequestError("prompt must be a string", param="prompt")
        return encode(emu.enc, prompt, _flag(body, "add_special_tokens", True))
    if "messages" in body:
        for name in ("add_generation_prompt", "continue_final_message", "add_special_tokens"):
            _flag(body, name, False)  # type checks only; counting applies the defaults
        return chat_ids(emu.tok, body, emu.enc)
    raise RequestError("a tokenize request needs `prompt` (a string) or `messages` (a chat)")


def tokenize_answer(emu: Emulator, raw: bytes) -> dict[str, Any]:
    """The TokenizeResponse for a raw request body."""
    body = parse_body(raw)
    emu.check_model(body)
    ids = tokenize_ids(emu, body)
    strs = emu.enc.convert_ids_to_tokens(ids) if _flag(body, "return_token_strs", False) else None
    return {"count": len(ids), "max_model_len": emu.config.max_model_len, "tokens": ids, "token_strs": strs}
