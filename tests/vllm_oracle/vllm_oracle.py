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

Each stdin line is {"endpoint": "chat" | "responses" | "completions" | "messages" | "count_tokens", "body":
{...}}, for the server whose model name (its folder, as `vllm serve` names it) is the body's "model" (else
the first folder's). Each
stdout line answers it as that server's request path does: pydantic validation of the request model
(FastAPI's RequestValidationError: 400); for chat, the request's parser built before rendering, as
OpenAIServingChat._create_chat_completion does; then ServingRender's render_*_request (the OnlineRenderer's
render_chat / render_responses / render_completion, the empty-prompt and max-tokens checks, the sampling
parameters). An ErrorResponse answers with its code, an exception with the code vLLM's exception handlers
give it (`create_error_response`: ValueError, TypeError, VLLMValidationError, jinja's TemplateError -> 400,
NotImplementedError -> 501, anything else 500). Answers: {"status": 200, "input_ids": [...], "prompts":
[[...], ...]} (one list per prompt; completions may have several) or {"status": N, "error": "..."}; a
Messages request's answer also carries "anthropic": {"merge_inline_system": bool, "disabled_thinking_effort":
str} (what the server's probes answered for it; absent when the body failed validation).
Anthropic Messages (`messages`: /v1/messages, `count_tokens`: /v1/messages/count_tokens) go the API server's
way (vllm/entrypoints/anthropic: api_router.py, serving.py): the body validated by AnthropicMessagesRequest /
AnthropicCountTokensRequest (400), converted by `AnthropicServingMessages.to_chat_completion_request` with
the two answers the server computes from its renderer (`_should_merge_inline_system(online_renderer)` at
start-up; the effort `thinking: disabled` becomes, probed on first use: 0.32's
`AnthropicServingMessages._probe_disabled_thinking_effort`, 0.33's `DisabledThinkingEffortResolver`), an
exception in the conversion answered as the router answers it (`create_error_response`), then rendered as a
chat: the parser built first for `messages` (create_messages goes through `create_chat_completion`), not
for `count_tokens` (it calls `render_chat_request` alone), then ServingRender.render_chat_request.
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


ANTHROPIC = ("messages", "count_tokens")


def _anthropic_request_model(endpoint: str) -> Any:
    from vllm.entrypoints.anthropic.protocol import AnthropicCountTokensRequest, AnthropicMessagesRequest

    return {"messages": AnthropicMessagesRequest, "count_tokens": AnthropicCountTokensRequest}[endpoint]


class _ProbingMessages:
    """0.32's probe of the effort `thinking: disabled` becomes is three methods of AnthropicServingMessages
    (`_get_disabled_thinking_effort`, `_probe_disabled_thinking_effort`, `_render_probe_prompt`) that read
    only `online_renderer`, `_disabled_thinking_effort` and `_extract_prompt_components`: vLLM's own methods,
    on an object that has just those (the handler itself needs an engine client)."""

    def __init__(self, online_renderer: Any) -> None:
        from vllm.entrypoints.anthropic.serving import AnthropicServingMessages
        from vllm.entrypoints.serve.engine.serving import BaseServing

        self.online_renderer = online_renderer
        self.model_config = online_renderer.model_config
        self._disabled_thinking_effort = None  # the server's default, "auto": probed on first use
        cls = AnthropicServingMessages
        self._get = cls._get_disabled_thinking_effort.__get__(self)
        self._probe_disabled_thinking_effort = cls._probe_disabled_thinking_effort.__get__(self)
        self._render_probe_prompt = cls._render_probe_prompt.__get__(self)
        self._extract_prompt_components = BaseServing._extract_prompt_components.__get__(self)

    async def resolve_for(self, request: Any) -> str:
        """0.32's create_messages / count_tokens: the probe only for a request whose thinking is disabled."""
        if request.thinking is not None and request.thinking.type == "disabled":
            return str(await self._get())
        return "none"


def _anthropic_server(state: Any) -> tuple[bool, Any]:
    """What AnthropicServingMessages.__init__ computes for the served model, once per folder (as the server
    does at start-up): whether inline system messages are merged, and its disabled-thinking resolver."""
    if not hasattr(state, "islwatch_anthropic"):
        from vllm.entrypoints.anthropic import serving

        online = state.online_renderer
        merge = serving.AnthropicServingMessages._should_merge_inline_system(online)
        resolver_cls = getattr(serving, "DisabledThinkingEffortResolver", None)  # 0.33; 0.32: the methods
        resolver = resolver_cls(online) if resolver_cls is not None else _ProbingMessages(online)
        state.islwatch_anthropic = (merge, resolver)
    anthropic: tuple[bool, Any] = state.islwatch_anthropic
    return anthropic


def _make_parser(state: Any, request: Any) -> None:
    """OpenAIServingChat._create_chat_completion: the request's parser is built before rendering."""
    online = state.online_renderer
    if online.parser is not None:
        online.parser(
            online.renderer.tokenizer,
            request.tools,
            chat_template_kwargs=online.effective_chat_template_kwargs(request),
            model_config=online.model_config,
        )


async def _render(state: Any, endpoint: str, request: Any, probed: dict[str, Any]) -> Any:
    render = state.serving_render
    if endpoint in ANTHROPIC:
        from vllm.entrypoints.anthropic.serving import AnthropicServingMessages

        merge, resolver = _anthropic_server(state)
        effort = await resolver.resolve_for(request)
        probed.update(merge_inline_system=merge, disabled_thinking_effort=effort)
        chat = AnthropicServingMessages.to_chat_completion_request(
            request, merge_inline_system=merge, disabled_thinking_effort=effort
        )
        if endpoint == "messages":
            _make_parser(state, chat)
        return await render.render_chat_request(chat)
    if endpoint == "chat":
        _make_parser(state, request)
        return await render.render_chat_request(request)
    if endpoint == "responses":
        return await render.render_responses_request(request)
    return await render.render_completion_request(request)


def answer(state: Any, loop: asyncio.AbstractEventLoop, endpoint: str, body: Any) -> dict[str, Any]:
    from pydantic import ValidationError
    from vllm.entrypoints.serve import create_error_response
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    try:
        model = _anthropic_request_model(endpoint) if endpoint in ANTHROPIC else _request_model(endpoint)
        request = model.model_validate(body)
    except ValidationError as exc:  # FastAPI's RequestValidationError handler: 400
        return {"status": 400, "error": f"validation: {exc.errors()[0].get('msg')}"}
    except Exception as exc:  # a validator's own error (VLLMValidationError): the app's handlers, its status
        err = create_error_response(exc)
        return {"status": err.error.code, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    probed: dict[str, Any] = {}  # a Messages request: what the server's probes answered for it
    extra = {"anthropic": probed} if endpoint in ANTHROPIC else {}
    try:
        result = loop.run_until_complete(_render(state, endpoint, request, probed))
    except Exception as exc:  # the app's exception handlers (serve/exception_handling): its status
        err = create_error_response(exc)
        if err.error.code >= 500:
            traceback.print_exc()
        return {"status": err.error.code, "error": f"{type(exc).__name__}: {str(exc)[:300]}", **extra}
    if isinstance(result, ErrorResponse):
        return {"status": result.error.code, "error": result.error.message[:300], **extra}
    generated = result if isinstance(result, list) else [result]
    prompts = [list(g.token_ids) for g in generated]
    return {"status": 200, "input_ids": prompts[0], "prompts": prompts, **extra}


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
