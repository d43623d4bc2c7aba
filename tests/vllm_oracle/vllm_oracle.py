"""vLLM's own request preprocessing, in-process, as a line-oriented oracle. Runs with a vLLM venv's python
(0.32: scripts/install_vllm.sh; 0.33: scripts/install_vllm_render.sh), never imported by the test process.
One script for both: where 0.33 moved an import, the 0.32 path is the fallback.

`python vllm_oracle.py MODEL_DIR [vllm serve flags...] [--and MODEL_DIR [flags...]]...` builds, for each
folder, what vLLM builds before its engine, with vLLM's own code and the steps of its GPU-less render server
(vllm/entrypoints/launchers/render/entry.py `run_launch_fastapi`): `vllm serve`'s argument parser,
`AsyncEngineArgs.create_model_config`, a VllmConfig, then `init_render_app_state` (render/app_state.py),
which builds the renderer (`renderer_from_config`: hf, mistral or the Harmony path by the folder), the
`OnlineRenderer` exactly as the API server's `init_app_state` does (launchers/api_server/app_state.py), and
`ServingRender`. No weights are read. Several folders share one process (and vLLM's imports).

Each stdin line is {"endpoint": "chat" | "responses" | "completions", "body": {...}}, for the server whose
model name (its folder, as `vllm serve` names it) is the body's "model" (else the first folder's). Each
stdout line answers it as that server's request path does: pydantic validation of the request model
(FastAPI's RequestValidationError: 400); for chat, the request's parser built before rendering, as
OpenAIServingChat._create_chat_completion does; then ServingRender's render_*_request (the OnlineRenderer's
render_chat / render_responses / render_completion, the empty-prompt and max-tokens checks, the sampling
parameters). An ErrorResponse answers with its code, an exception with the code vLLM's exception handlers
give it (`create_error_response`: ValueError, TypeError, VLLMValidationError, jinja's TemplateError -> 400,
NotImplementedError -> 501, anything else 500). Answers: {"status": 200, "input_ids": [...], "prompts":
[[...], ...]} (one list per prompt; completions may have several) or {"status": N, "error": "..."}.
The first stdout line is {"ready": true, "version": vllm.__version__, "seconds": {"imports": s, MODEL_DIR: s,
...}} (how long the imports and each folder's build took). Log output goes to stderr.

Environment: VLLM_TARGET_DEVICE=cpu; for gpt-oss, TIKTOKEN_ENCODINGS_BASE (openai-harmony's vocabulary,
offline) and VLLM_SYSTEM_START_DATE (Harmony's "Current date") pass through from the caller.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import traceback
from typing import Any


def build(argv: list[str], loop: asyncio.AbstractEventLoop) -> Any:
    """The render server's app state for MODEL_DIR and the given `vllm serve` flags."""
    from starlette.datastructures import State
    from vllm import AsyncEngineArgs, envs
    from vllm.config import VllmConfig

    try:  # 0.33 moved `vllm serve`'s arguments to entrypoints/common (its render/entry.py imports them there)
        from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:  # 0.32
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.launchers.render.app_state import init_render_app_state
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", argv[0], *argv[1:]])
    validate_parsed_serve_args(args)
    engine_args = AsyncEngineArgs.from_cli_args(args)
    model_config = engine_args.create_model_config()
    model_config.quantization = None  # as run_launch_fastapi: preprocessing only
    envs.VLLM_CPU_KVCACHE_SPACE = 0
    vllm_config = VllmConfig(
        model_config=model_config,
        logging_config=engine_args.create_logging_config(),
        structured_outputs_config=engine_args.create_structured_outputs_config(),
    )
    state = State()
    loop.run_until_complete(init_render_app_state(vllm_config, state, args))
    return state


def _request_model(endpoint: str) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    return {"chat": ChatCompletionRequest, "responses": ResponsesRequest, "completions": CompletionRequest}[
        endpoint
    ]


async def _render(state: Any, endpoint: str, request: Any) -> Any:
    render = state.serving_render
    if endpoint == "chat":
        online = state.online_renderer
        if online.parser is not None:  # OpenAIServingChat._create_chat_completion: _make_parser first
            online.parser(
                online.renderer.tokenizer,
                request.tools,
                chat_template_kwargs=online.effective_chat_template_kwargs(request),
                model_config=online.model_config,
            )
        return await render.render_chat_request(request)
    if endpoint == "responses":
        return await render.render_responses_request(request)
    return await render.render_completion_request(request)


def answer(state: Any, loop: asyncio.AbstractEventLoop, endpoint: str, body: Any) -> dict[str, Any]:
    from pydantic import ValidationError
    from vllm.entrypoints.serve import create_error_response
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    try:
        request = _request_model(endpoint).model_validate(body)
    except ValidationError as exc:  # FastAPI's RequestValidationError handler: 400
        return {"status": 400, "error": f"validation: {exc.errors()[0].get('msg')}"}
    try:
        result = loop.run_until_complete(_render(state, endpoint, request))
    except Exception as exc:  # the app's exception handlers (serve/exception_handling): its status
        err = create_error_response(exc)
        if err.error.code >= 500:
            traceback.print_exc()
        return {"status": err.error.code, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    if isinstance(result, ErrorResponse):
        return {"status": result.error.code, "error": result.error.message[:300]}
    generated = result if isinstance(result, list) else [result]
    prompts = [list(g.token_ids) for g in generated]
    return {"status": 200, "input_ids": prompts[0], "prompts": prompts}


def groups(argv: list[str]) -> list[list[str]]:
    """MODEL_DIR [flags] [--and MODEL_DIR [flags]]...: one server's arguments each."""
    out: list[list[str]] = [[]]
    for arg in argv:
        if arg == "--and":
            out.append([])
        else:
            out[-1].append(arg)
    return out


def main(argv: list[str]) -> int:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever vLLM prints goes to stderr; stdout carries the answers only
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    started = time.monotonic()
    import vllm

    loop = asyncio.new_event_loop()  # one loop: the renderer's async helpers are made on it
    seconds = {"imports": time.monotonic() - started}
    # Several servers in one process share vLLM's imports (~25 s, ~600 MB): each folder's state is its own.
    states = {}
    for group in groups(argv):
        began = time.monotonic()
        states[group[0]] = build(group, loop)
        seconds[group[0]] = time.monotonic() - began
    first = next(iter(states.values()))
    out.write(json.dumps({"ready": True, "version": vllm.__version__, "seconds": seconds}) + "\n")
    for line in sys.stdin:
        if line.strip():
            query = json.loads(line)
            body = query["body"]
            model = body.get("model") if isinstance(body, dict) else None
            state = states.get(model, first) if isinstance(model, str) else first  # the served model's name
            out.write(json.dumps(answer(state, loop, query["endpoint"], body)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
