"""The whole bill against the real vLLM 0.32 server: the Llama 3.1 one (vllm_proc.BILLED_FAMILY) runs with
`--enable-prompt-tokens-details`, prefix caching in 32-token blocks and its stats loggers on.

- Through `islwatch proxy --upstream-metrics-url`: chat, completions and /v1/responses, JSON and SSE, read by
  the openai client (an independent parser). islwatch's usage metrics equal what the client read, and the
  engine's own counters, scraped beside them, equal the same sums: `vllm:prompt_tokens_total` counts cached
  prompt tokens too, `vllm:prompt_tokens_cached_total` and `vllm:prefix_cache_hits_total` are usage's
  `cached_tokens`, `vllm:generation_tokens_total` the output tokens (docs/metrics.md, "The engine's own counters").
- A server started with `--disable-log-stats` (the other test servers) has no token counters to read.
- The loadgen's cache-bust proof: a workload run twice with the same seed and new markers. Each first turn is
  served from the cache exactly as far as it shares whole 32-token blocks with a prompt sent before it (so,
  with a marker, only up to the marker), never its last token; a second turn at least its first turn.
"""

from __future__ import annotations

import asyncio
import random
import urllib.request
from typing import Any

import pytest
from openai import OpenAI

from loadgen.config import LoadgenConfig
from loadgen.report.model import build_report
from loadgen.send.replies import Record
from loadgen.send.runner import Engine
from loadgen.workload.conversations import Workload
from loadgen.workload.markers import CacheBust
from proxy.core.tokens import template_ids
from proxy.server.engine_metrics import engine_of, samples
from tests.conftest import TEST_TOKENIZERS, load_shared
from tests.eventually import eventually
from tests.server.helpers import Background, parse_metrics, proxy_config, value
from tests.vllm_server.vllm_proc import BILLED_BLOCK, BILLED_FAMILY, VllmServer

pytestmark = pytest.mark.vllm

# Long enough that a repeat shares several whole blocks with the first request.
SYSTEM = "You are a careful assistant. " + " ".join(["Answer about rivers, gardens and letters."] * 20)
USER = "What is the capital of France?"


@pytest.fixture(scope="module")
def billed(vllm_servers: dict[str, VllmServer]) -> VllmServer:
    return vllm_servers[BILLED_FAMILY]


@pytest.fixture(scope="module")
def bill_proxy(billed: VllmServer, background: Background) -> tuple[str, str]:
    """A proxy of its own, started for this module: its engine counters count from its start."""
    from proxy.server.app import run_proxy

    cfg = proxy_config(
        billed.base_url,
        tokenizer="none",
        model_tokenizers={billed.model: str(TEST_TOKENIZERS / billed.family)},
        upstream_metrics_url=billed.base_url + "/metrics",
        upstream_metrics_interval_seconds=0.2,
    )
    url, admin_url, _ = background.enter(run_proxy(cfg))
    return url, admin_url


def metrics(admin_url: str) -> dict[Any, float]:
    with urllib.request.urlopen(admin_url + "/metrics", timeout=30) as resp:
        return parse_metrics(resp.read().decode())


def send_mix(client: OpenAI, model: str) -> list[tuple[str, Any]]:
    """(endpoint, the usage object the openai client read) for each answer."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    out: list[tuple[str, Any]] = []
    for _ in range(2):  # the repeat is served from the prefix cache
        resp = client.chat.completions.create(model=model, messages=messages, max_tokens=4)  # type: ignore[arg-type]
        out.append(("chat", resp.usage))
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=4, stream=True, stream_options={"include_usage": True}
    )  # type: ignore[call-overload]
    out.append(("chat", [c.usage for c in stream if c.usage is not None][-1]))
    prompt = SYSTEM + " " + USER
    out.append(("completions", client.completions.create(model=model, prompt=prompt, max_tokens=3).usage))
    stream = client.completions.create(
        model=model, prompt=prompt, max_tokens=3, stream=True, stream_options={"include_usage": True}
    )
    out.append(("completions", [c.usage for c in stream if c.usage is not None][-1]))
    out.append(("responses", client.responses.create(model=model, input=prompt, max_output_tokens=3).usage))
    events = client.responses.create(model=model, input=prompt, max_output_tokens=3, stream=True)
    out.append(("responses", [e.response.usage for e in events if e.type == "response.completed"][-1]))
    return out


def fields(endpoint: str, usage: Any) -> tuple[int, int, int | None, int | None]:
    """(prompt, output, cached, reasoning) as the openai client read them; None where not reported."""
    if endpoint == "responses":
        details, out_details = usage.input_tokens_details, usage.output_tokens_details
        return usage.input_tokens, usage.output_tokens, details.cached_tokens, out_details.reasoning_tokens
    details, out_details = usage.prompt_tokens_details, usage.completion_tokens_details
    cached = details.cached_tokens if details is not None else None
    reasoning = out_details.reasoning_tokens if out_details is not None else None
    return usage.prompt_tokens, usage.completion_tokens, cached, reasoning


def test_usage_metrics_and_engine_counters_equal_the_usage_answered(
    billed: VllmServer, bill_proxy: tuple[str, str]
) -> None:
    url, admin_url = bill_proxy
    eventually(
        lambda: metrics(admin_url), until=lambda m: value(m, "islwatch_engine_scrapes_total", result="ok") > 0
    )
    before = metrics(admin_url)
    answers = [
        (e, fields(e, u)) for e, u in send_mix(OpenAI(base_url=url + "/v1", api_key="x"), billed.model)
    ]
    prompt = sum(f[0] for _, f in answers)
    output = sum(f[1] for _, f in answers)
    cached = sum(f[2] or 0 for _, f in answers)
    assert cached > 0, answers  # the repeats were served from the cache: there is something to count

    def delta(m: dict[Any, float], name: str, **labels: str) -> float:
        return value(m, name, **labels) - value(before, name, **labels)

    def engine(m: dict[Any, float], kind: str) -> float:
        return delta(m, "islwatch_engine_tokens_total", kind=kind, engine="vllm")

    m = eventually(
        lambda: metrics(admin_url),
        until=lambda m: (
            delta(m, "islwatch_usage_fields_total", field="prompt_tokens") == len(answers)
            # each counter may reach the API server's /metrics in a later stats update than the answer
            # (the engine core sends iteration stats apart from outputs): wait for all of them
            and engine(m, "prompt") >= prompt
            and engine(m, "generation") >= output
            and engine(m, "cached_prompt") >= cached
        ),
        what="the proxy's analyses and a scrape after the traffic",
        describe=lambda m: (
            f"engine prompt +{engine(m, 'prompt')} generation +{engine(m, 'generation')}, usage prompt "
            f"{prompt} output {output}"
        ),
    )
    assert delta(m, "islwatch_isl_tokens_sum", kind="server") == prompt
    assert delta(m, "islwatch_output_tokens_sum") == output
    assert delta(m, "islwatch_cached_prompt_tokens_sum") == cached
    for endpoint in ("chat", "completions", "responses"):
        mine = [f for e, f in answers if e == endpoint]
        assert delta(m, "islwatch_output_tokens_sum", endpoint=endpoint) == sum(f[1] for f in mine)
        assert delta(m, "islwatch_cached_prompt_tokens_sum", endpoint=endpoint) == sum(
            f[2] or 0 for f in mine
        )
        reasoning = [f[3] for f in mine if f[3] is not None]
        assert delta(m, "islwatch_reasoning_tokens_count", endpoint=endpoint) == len(reasoning)
        assert delta(m, "islwatch_reasoning_tokens_sum", endpoint=endpoint) == sum(reasoning)
    # vLLM reports cached tokens everywhere with --enable-prompt-tokens-details, reasoning tokens only on
    # /v1/responses (chat needs a reasoning parser): "not reported" is told from zero.
    reported_reasoning = sum(f[3] is not None for _, f in answers)
    assert reported_reasoning == 2

    def present(field_name: str, yes: str) -> float:
        return delta(m, "islwatch_usage_fields_total", field=field_name, present=yes)

    assert (present("reasoning_tokens", "true"), present("reasoning_tokens", "false")) == (
        2,
        len(answers) - 2,
    )
    assert present("cached_prompt_tokens", "true") == len(answers)
    # The engine's own counters, over the same traffic (nothing else reached this server meanwhile).
    assert engine(m, "prompt") == prompt  # cached tokens included
    assert engine(m, "prefix_cache_queries") == prompt
    assert engine(m, "cached_prompt") == cached
    assert engine(m, "prefix_cache_hits") == cached
    assert engine(m, "generation") == output
    print(
        f"vLLM bill: {len(answers)} answers, usage prompt {prompt} (cached {cached}), output {output}; engine "
        f"counters: prompt {engine(m, 'prompt')}, cached {engine(m, 'cached_prompt')}, prefix-cache queries "
        f"{engine(m, 'prefix_cache_queries')} and hits {engine(m, 'prefix_cache_hits')}, generation "
        f"{engine(m, 'generation')}; per answer (endpoint, prompt, output, cached, reasoning): {answers}"
    )


def test_disable_log_stats_leaves_no_token_counters(vllm_servers: dict[str, VllmServer]) -> None:
    """The servers started with `--disable-log-stats` have no stats loggers, so no counters to scrape."""
    other = next(s for k, s in vllm_servers.items() if s.family != BILLED_FAMILY and not s.embedding)
    with urllib.request.urlopen(other.base_url + "/metrics", timeout=30) as resp:
        page = resp.read().decode()
    assert engine_of(samples(page)) is None


# ---- the cache-bust proof ------------------------------------------------------------------------------

TARGETS = list(CacheBust)
ISL, SYSTEM_TOKENS, CONVERSATIONS = 512, 256, 3


def run_twice(server: VllmServer, target: CacheBust) -> tuple[LoadgenConfig, list[Record], list[Record]]:
    """The same workload (seed) twice, each time with its own markers (run id); one request at a time."""
    tok = load_shared(BILLED_FAMILY).tokenizer
    seed = random.randrange(1 << 31)  # texts no earlier run (in this server's cache) sent
    base = dict(
        url=server.base_url, model=server.model, tokenizer=str(TEST_TOKENIZERS / BILLED_FAMILY), isl=ISL,
        osl=16, turns=2, shared_system_prompt_length=SYSTEM_TOKENS, cache_bust=target, concurrency=1,
        request_count=2 * CONVERSATIONS, seed=seed,
    )  # fmt: skip
    runs = []
    for run_id in ("first", "second"):
        cfg = LoadgenConfig(**base, run_id=f"{target.value}-{run_id}")  # type: ignore[arg-type]
        runs.append((cfg, asyncio.run(Engine(cfg, Workload(tok, cfg)).run())))
    return runs[1][0], runs[0][1], runs[1][1]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@pytest.mark.parametrize("target", TARGETS, ids=[t.value for t in TARGETS])
def test_cache_bust_proof(billed: VllmServer, target: CacheBust) -> None:
    cfg, first, second = run_twice(billed, target)
    tok = load_shared(BILLED_FAMILY).tokenizer
    records = first + second
    assert all(r.status == 200 and r.error is None and r.cached_prompt_tokens is not None for r in records)
    # First turns are rebuilt from the (deterministic) workloads: their token ids as the server renders them.
    ids: dict[tuple[str, str], list[int]] = {}
    for run, recs in (("first", first), ("second", second)):
        run_cfg = cfg.model_copy(update={"run_id": f"{target.value}-{run}"})
        workload = Workload(tok, run_cfg)
        for r in recs:
            if r.turn == 1:
                _, req = workload.start(r.conversation)
                ids[(run, r.conversation)] = template_ids(tok, req.body["messages"], True, False)
    sent: list[list[int]] = []  # the first turns sent so far, in order (one request at a time)
    for run, recs in (("first", first), ("second", second)):
        for r in sorted(recs, key=lambda r: r.sent_at):
            if r.turn != 1:
                continue
            mine = ids[(run, r.conversation)]
            assert len(mine) == r.server_prompt_tokens
            shared = max((common_prefix(mine, other) for other in sent), default=0)
            whole_blocks = min(shared, len(mine) - 1) // BILLED_BLOCK * BILLED_BLOCK
            assert r.cached_prompt_tokens == whole_blocks, (run, r.conversation, shared, cfg.seed)
            sent.append(mine)
    for recs in (first, second):
        prompts = {r.conversation: r.server_prompt_tokens for r in recs if r.turn == 1}
        for r in (r for r in recs if r.turn == 2):
            assert r.server_prompt_tokens is not None and r.cached_prompt_tokens is not None
            # Its own first turn is a prefix of it, all but perhaps that turn's last token.
            low = ((prompts[r.conversation] or 0) - 1) // BILLED_BLOCK * BILLED_BLOCK
            assert (
                low <= r.cached_prompt_tokens <= (r.server_prompt_tokens - 1) // BILLED_BLOCK * BILLED_BLOCK
            ), r
    report = build_report(
        second, run_id=cfg.run_id, config=cfg.model_dump(mode="json"), tokenizer={}, overhead=None
    )
    shares = {t.turn: t.cache.share for t in report.turns if t.cache is not None}
    print(f"cache-bust {target.value}: the second run's share served from the cache, by turn: {shares}")
    if target is CacheBust.NONE:  # a repeat: every first turn but its last, partial, block
        assert shares[1] == (ISL - 1) // BILLED_BLOCK * BILLED_BLOCK / ISL
    if target is CacheBust.SYSTEM_PREFIX:  # the marker opens the system prompt: no whole block before it
        assert shares[1] == 0
