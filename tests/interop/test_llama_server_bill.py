"""The whole bill against a real llama-server (started with `--metrics`, one slot: it reuses the slot's KV
cache for the prompt it shares with the previous one): `islwatch proxy --server-flavor llama.cpp
--upstream-metrics-url` (the real CLI, a subprocess) in front of it, chat and completions, JSON and SSE,
read by the openai client.

islwatch's usage metrics equal what the client read. llama-server's own counters, scraped beside them,
count differently (measured here): `llamacpp:prompt_tokens_total` leaves out the cached tokens, which
`llamacpp:prompt_tokens_cached_total` counts, so islwatch's `prompt` kind adds them back and equals the usage's
`prompt_tokens`; `llamacpp:tokens_predicted_total` is the output tokens. A list of two prompts, streamed,
carries each prompt's usage on its own finish chunk: summed, details included.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from tests.eventually import eventually
from tests.interop.llama_server_proc import LlamaServer
from tests.interop.proxy_proc import Proxy, running_proxy, scrape

pytestmark = pytest.mark.llama_server

SYSTEM = "You are a careful assistant who answers in one short sentence about the world and its rivers."
MESSAGES = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "What is the capital of France?"},
]
PROMPT = "The sky is blue because"


@pytest.fixture(scope="module")
def bill_proxy(
    request: pytest.FixtureRequest, llama_server: LlamaServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proxy]:
    tokenizer = str(request.getfixturevalue("family_tokenizer").name_or_path)
    log_path: Path = tmp_path_factory.mktemp("islwatch-bill") / f"{llama_server.family}.log"
    args = ("--server-flavor", "llama.cpp", "--upstream-metrics-url", f"{llama_server.base_url}/metrics",
            "--upstream-metrics-interval-seconds", "0.2")  # fmt: skip
    with running_proxy(llama_server.base_url, tokenizer, log_path, extra_args=args) as proxy:
        yield proxy


def total(samples: dict[Any, float], name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def send_mix(client: OpenAI) -> list[tuple[str, Any]]:
    """(endpoint, the usage the openai client read) per answer; repeats share the slot's cache."""
    out: list[tuple[str, Any]] = []
    for _ in range(2):
        resp = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=3)  # type: ignore[arg-type]
        out.append(("chat", resp.usage))
    stream = client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=3, stream=True, stream_options={"include_usage": True}
    )  # type: ignore[call-overload]
    out.append(("chat", [c.usage for c in stream if c.usage is not None][-1]))
    for _ in range(2):
        out.append(("completions", client.completions.create(model="m", prompt=PROMPT, max_tokens=3).usage))
    stream = client.completions.create(model="m", prompt=PROMPT, max_tokens=3, stream=True)
    out.append(("completions", [c.usage for c in stream if c.usage is not None][-1]))
    return out


def test_usage_metrics_and_engine_counters(bill_proxy: Proxy) -> None:
    eventually(
        lambda: scrape(bill_proxy), until=lambda m: total(m, "islwatch_engine_scrapes_total", result="ok") > 0
    )
    before = scrape(bill_proxy)
    answers = send_mix(OpenAI(base_url=f"{bill_proxy.base_url}/v1", api_key="sk-none", max_retries=0))
    prompt = sum(u.prompt_tokens for _, u in answers)
    output = sum(u.completion_tokens for _, u in answers)
    cached = sum(u.prompt_tokens_details.cached_tokens for _, u in answers)
    assert cached > 0, answers  # the repeats reused the slot's cache

    def delta(m: dict[Any, float], name: str, **labels: str) -> float:
        return total(m, name, **labels) - total(before, name, **labels)

    def engine(m: dict[Any, float], kind: str) -> float:
        return delta(m, "islwatch_engine_tokens_total", kind=kind, engine="llama.cpp")

    m = eventually(
        lambda: scrape(bill_proxy),
        until=lambda m: (
            delta(m, "islwatch_usage_fields_total", field="prompt_tokens") == len(answers)
            and engine(m, "prompt") >= prompt
        ),
        what="the proxy's analyses and a scrape after the traffic",
        describe=lambda m: f"engine prompt +{engine(m, 'prompt')}, usage prompt {prompt}",
    )
    assert delta(m, "islwatch_isl_tokens_sum", kind="server") == prompt
    assert delta(m, "islwatch_output_tokens_sum") == output
    assert delta(m, "islwatch_cached_prompt_tokens_sum") == cached
    for endpoint in ("chat", "completions"):
        mine = [u for e, u in answers if e == endpoint]
        assert delta(m, "islwatch_cached_prompt_tokens_sum", endpoint=endpoint) == sum(
            u.prompt_tokens_details.cached_tokens for u in mine
        )
    # llama-server reports cached tokens on every answer and reasoning tokens on none.
    assert delta(m, "islwatch_usage_fields_total", field="cached_prompt_tokens", present="true") == len(
        answers
    )
    assert delta(m, "islwatch_usage_fields_total", field="reasoning_tokens", present="false") == len(answers)
    assert engine(m, "prompt") == prompt  # llamacpp:prompt_tokens_total + llamacpp:prompt_tokens_cached_total
    assert engine(m, "cached_prompt") == cached
    assert engine(m, "generation") == output
    print(
        f"llama-server bill: {len(answers)} answers, usage prompt {prompt} (cached {cached}), output {output}; "
        f"engine counters: processed {prompt - cached}, cached {engine(m, 'cached_prompt')}, "
        f"predicted {engine(m, 'generation')}"
    )


def test_two_prompts_streamed_sum_their_cached_tokens(bill_proxy: Proxy) -> None:
    """llama.cpp streams a list of prompts with each one's usage on its finish chunk, and no total."""
    before = scrape(bill_proxy)
    client = OpenAI(base_url=f"{bill_proxy.base_url}/v1", api_key="sk-none", max_retries=0)
    stream = client.completions.create(
        model="m", prompt=[PROMPT, PROMPT + " and the sea"], max_tokens=2, stream=True
    )
    usages = [c.usage for c in stream if c is not None and c.usage is not None]  # it sends `data: null` too
    assert len(usages) == 2  # one per prompt
    # The second prompt extends the first, processed before it in the one slot: a part of it is cached.
    assert usages[1].prompt_tokens_details.cached_tokens > 0
    m = eventually(
        lambda: scrape(bill_proxy),
        until=lambda m: (
            total(m, "islwatch_usage_fields_total", field="prompt_tokens")
            > total(before, "islwatch_usage_fields_total", field="prompt_tokens")
        ),
        what="the analysis of the two-prompt stream",
    )
    cached = total(m, "islwatch_cached_prompt_tokens_sum") - total(
        before, "islwatch_cached_prompt_tokens_sum"
    )
    assert cached == sum(u.prompt_tokens_details.cached_tokens for u in usages)
    prompt = total(m, "islwatch_isl_tokens_sum", kind="server") - total(
        before, "islwatch_isl_tokens_sum", kind="server"
    )
    assert prompt == sum(u.prompt_tokens for u in usages)
