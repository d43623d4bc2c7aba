"""SGLang's own chat preprocessing, in-process, as a line-oriented oracle. Runs with the SGLang venv's python
(scripts/install_sglang.sh), never imported by the test process.

`python sglang_oracle.py MODEL_DIR [server args...]` builds what `sglang serve` builds before its engine, with
SGLang's own code: `prepare_server_args`, `publish(role="tokenizer")`, the TokenizerManager's
`init_model_config` and `init_tokenizer_and_processor` (its `get_tokenizer`; no ZMQ sockets, no scheduler),
`TemplateManager.initialize_templates`, `OpenAIServingChat`. Each stdin line is a chat request body; each
stdout line answers it as the server's request path does (http_server.py `openai_v1_chat_completions`, then
serving_base.py `handle_request`): pydantic validation (a 400), `_validate_request` (a 400),
`_convert_to_internal_request` (ValueError: 400, anything else: 500), else the prompt's `input_ids`.
A line {"endpoint": "messages" | "count_tokens", "body": ...} is an Anthropic request, answered as
`/v1/messages` and `/v1/messages/count_tokens` answer it (`messages_answer`).
The first stdout line is {"ready": true, "version": ...}. Log output goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any


def build(argv: list[str]) -> Any:
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.parser.template_manager import TemplateManager
    from sglang.srt.runtime_context import get_model, get_serving, publish
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(["--model-path", argv[0], "--device", "cpu", *argv[1:]])
    publish(server_args, role="tokenizer")
    # TokenizerManager.__init__ also opens its ZMQ sockets to a scheduler; the two init steps that read the
    # model config and load the tokenizer are what the chat path reads.
    manager = TokenizerManager.__new__(TokenizerManager)
    manager.server_args = server_args
    manager.init_model_config()
    manager.init_tokenizer_and_processor()
    templates = TemplateManager()
    templates.initialize_templates(
        tokenizer_manager=manager,
        model_path=get_model().model_path,
        chat_template=get_serving().chat_template,
        completion_template=get_serving().completion_template,
    )
    return OpenAIServingChat(manager, templates)


def answer(chat: Any, body: Any) -> dict[str, Any]:
    from pydantic import ValidationError
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        return {"status": 400, "error": f"validation: {exc.errors()[0].get('msg')}"}
    message = chat._validate_request(request)
    if message:
        return {"status": 400, "error": message}
    try:
        adapted, _ = chat._convert_to_internal_request(request, None)
    except ValueError as exc:
        return {"status": 400, "error": str(exc)[:300]}
    except Exception as exc:  # serving_base.py answers 500 for anything else
        traceback.print_exc()
        return {"status": 500, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    ids = adapted.input_ids
    if ids is None:  # a text prompt: the tokenizer manager encodes it as it comes
        ids = chat.tokenizer_manager.tokenizer.encode(adapted.text)
    return {"status": 200, "input_ids": list(ids)}


def _validation(exc: Any) -> dict[str, Any]:
    """http_server.py `validation_exception_handler` for /v1/messages: FastAPI's body validation is a 400."""
    return {"status": 400, "error": f"validation: {exc.errors()[0].get('msg')}"}


def _ids(chat: Any, ids: Any, text: Any) -> list[int]:
    return list(ids) if ids is not None else list(chat.tokenizer_manager.tokenizer.encode(text))


def messages_answer(serving: Any, endpoint: str, body: Any) -> dict[str, Any]:
    """SGLang's own Anthropic path (entrypoints/anthropic/serving.py) up to the prompt's ids.
    `messages`: the request model (FastAPI's validation, a 400), `handle_messages`:
    `_convert_to_chat_completion_request` (any exception: 400), then `_handle_non_streaming`'s
    `_validate_request` (400) and `_convert_to_internal_request` (ValueError: 400, HTTPException: its status,
    anything else: 500), whose prompt is then encoded as the chat path encodes it.
    `count_tokens`: `handle_count_tokens`: the request model, the conversion through an
    `AnthropicMessagesRequest` with max_tokens=1 (any exception: 400), then `_process_messages` alone
    (ValueError: 400, anything else: 500); its `prompt_ids`, or the encoded text when they are a string."""
    from fastapi import HTTPException
    from pydantic import ValidationError
    from sglang.srt.entrypoints.anthropic.protocol import (
        AnthropicCountTokensRequest,
        AnthropicMessagesRequest,
    )

    chat = serving.openai_serving_chat
    model = AnthropicMessagesRequest if endpoint == "messages" else AnthropicCountTokensRequest
    try:
        request = model.model_validate(body)
    except ValidationError as exc:
        return _validation(exc)
    if endpoint == "count_tokens":
        try:
            messages_request = AnthropicMessagesRequest(
                model=request.model,
                messages=request.messages,
                max_tokens=1,
                system=request.system,
                thinking=request.thinking,
                tools=request.tools,
                tool_choice=request.tool_choice,
                output_config=request.output_config,
            )
            chat_request = serving._convert_to_chat_completion_request(messages_request)
        except Exception as exc:
            return {"status": 400, "error": f"conversion: {str(exc)[:300]}"}
        try:
            is_multimodal = chat.tokenizer_manager.model_config.is_multimodal
            processed = chat._process_messages(chat_request, is_multimodal)
        except ValueError as exc:
            return {"status": 400, "error": str(exc)[:300]}
        except Exception as exc:
            traceback.print_exc()
            return {"status": 500, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        ids = processed.prompt_ids
        return {"status": 200, "input_ids": _ids(chat, ids if isinstance(ids, list) else None, ids)}
    try:
        chat_request = serving._convert_to_chat_completion_request(request)
    except Exception as exc:
        return {"status": 400, "error": f"conversion: {str(exc)[:300]}"}
    message = chat._validate_request(chat_request)
    if message:
        return {"status": 400, "error": message}
    try:
        adapted, _ = chat._convert_to_internal_request(chat_request, None)
    except ValueError as exc:
        return {"status": 400, "error": str(exc)[:300]}
    except HTTPException as exc:
        return {"status": exc.status_code, "error": str(exc.detail)[:300]}
    except Exception as exc:
        traceback.print_exc()
        return {"status": 500, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return {"status": 200, "input_ids": _ids(chat, adapted.input_ids, adapted.text)}


def main(argv: list[str]) -> int:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever SGLang prints goes to stderr; stdout carries the answers only
    import sglang
    from sglang.srt.entrypoints.anthropic.serving import AnthropicServing

    chat = build(argv)
    anthropic = AnthropicServing(chat)  # http_server.py builds it on the chat handler, as here
    out.write(json.dumps({"ready": True, "version": sglang.__version__}) + "\n")
    for line in sys.stdin:
        if line.strip():
            request = json.loads(line)
            if isinstance(request, dict) and request.get("endpoint") in ("messages", "count_tokens"):
                out.write(json.dumps(messages_answer(anthropic, request["endpoint"], request["body"])) + "\n")
            else:
                out.write(json.dumps(answer(chat, request)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
