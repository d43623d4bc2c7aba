"""The Anthropic Messages API through the proxy, sent by the Anthropic SDK: `/v1/messages` (JSON and
streamed) and `/v1/messages/count_tokens` to the emulator answering like vLLM, with its prefix cache on, so
`usage.input_tokens` leaves out the cached part of the prompt. Every request must be counted exact against
the prompt the server processed (input + cache read), and count_tokens must be read as a server count."""

from __future__ import annotations

import aiohttp
import anthropic

from proxy.emulator.app import EmulatorConfig, build_emulator_app
from proxy.server.app import run_proxy
from tests.anthropic_shapes import SHAPES
from tests.conftest import load_shared, shared_dir
from tests.server.helpers import proxy_config, serve_app, settled, value, wait_metrics

FAMILY = "qwen3"
# A long shared system prompt: the second and later requests read its blocks from the prefix cache.
SYSTEM = "You are a careful coding assistant working in a large repository. " * 12
CHOSEN = {"plain_string", "system_blocks", "tool_use_and_result", "parallel_tools", "agent_loop_5"}


async def test_messages_are_exact_with_the_prefix_cache_on() -> None:
    folder = str(shared_dir(FAMILY))
    config = EmulatorConfig(tokenizer=folder, prefix_cache=True)
    async with (
        serve_app(build_emulator_app(config, tokenizer=load_shared(FAMILY))) as emulator,
        run_proxy(proxy_config(emulator, tokenizer=folder)) as (url, admin, _),
        aiohttp.ClientSession() as s,
    ):
        client = anthropic.AsyncAnthropic(base_url=url, api_key="unused", max_retries=0)
        sent, cached_reads = 0, 0
        for shape in (s for s in SHAPES if s.name in CHOSEN):
            body = {**shape.body, "system": SYSTEM, "model": "m", "max_tokens": 3}
            message = await client.messages.create(**body)
            cached_reads += bool(message.usage.cache_read_input_tokens)
            async with client.messages.stream(**body) as stream:
                final = await stream.get_final_message()
            assert final.usage.output_tokens == 3
            counted = await client.messages.count_tokens(
                **{k: v for k, v in body.items() if k != "max_tokens"}
            )
            # the prompt the server processed, whatever part of it came from the cache
            usage = message.usage
            assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == counted.input_tokens
            sent += 1
        assert cached_reads >= sent - 1  # every request after the first shares the system prompt's blocks
        m = await wait_metrics(
            s,
            admin,
            lambda m: settled(m) and value(m, "islwatch_isl_match_total", endpoint="count_tokens") == sent,
        )
        assert value(m, "islwatch_isl_match_total", endpoint="messages", result="exact") == 2 * sent
        assert value(m, "islwatch_isl_match_total", endpoint="count_tokens", result="exact") == sent
        assert value(m, "islwatch_isl_drift_tokens_sum") == 0
