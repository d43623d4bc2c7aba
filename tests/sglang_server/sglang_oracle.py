"""SGLang's own chat preprocessing, in-process, as a line-oriented oracle. Runs with the SGLang venv's python
(scripts/install_sglang.sh), never imported by the test process.

`python sglang_oracle.py MODEL_DIR [server args...]` builds what `sglang serve` builds before its engine, with
SGLang's own code: `prepare_server_args`, `publish(role="tokenizer")`, the TokenizerManager's
`init_model_config` and `init_tokenizer_and_processor` (its `get_tokenizer`; no ZMQ sockets, no scheduler),
`TemplateManager.initialize_templates`, `OpenAIServingChat`. Each stdin line is a chat request body; each
stdout line answers it as the server's request path does (http_server.py `openai_v1_chat_completions`, then
serving_base.py `handle_request`): pydantic validation (a 400), `_validate_request` (a 400),
`_convert_to_internal_request` (ValueError: 400, anything else: 500), else the prompt's `input_ids`.
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


def main(argv: list[str]) -> int:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever SGLang prints goes to stderr; stdout carries the answers only
    import sglang

    chat = build(argv)
    out.write(json.dumps({"ready": True, "version": sglang.__version__}) + "\n")
    for line in sys.stdin:
        if line.strip():
            out.write(json.dumps(answer(chat, json.loads(line))) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
