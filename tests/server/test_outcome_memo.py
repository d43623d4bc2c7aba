"""The outcome memo (proxy/server/memo.py): a repeated body with the same server count is applied from the
outcome kept for it, with this answer's usage, and never biases a metric.

First the memo alone, with outcomes a real Analyzer (the builtin Mistral tokenizer) computes: what it
reuses equals what a worker would compute for the new answer. Then end to end, with `islwatch emulate`
upstreams: a proxy with the memo and one without it (`analysis_memo=0`) given the same traffic, whose metrics
must agree on every family but the analysis time; and, behind a front that switches emulators, a server count
that changes for the same body sends the request back to a worker, as a reload does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from proxy.core.tokenizer import load_tokenizer
from proxy.core.usage import Usage
from proxy.emulator.app import EmulatorConfig, start_emulator
from proxy.emulator.faults import parse_faults
from proxy.server.analyzer import Analyzer
from proxy.server.app import run_proxy
from proxy.server.memo import OutcomeMemo, Reuse
from proxy.server.metrics import build_metrics
from proxy.server.problems import ProblemLog
from proxy.server.records import DEFAULT_KEY, DEFAULT_LABEL, AnalysisJob, AnalysisOutcome, AnalysisSpec
from tests.server.helpers import Background, proxy_config, serve_app, settled, value, wait_metrics

TOKENIZER = "builtin:mistral-v0.1"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "What is the capital of France?"}]}
BODY = orjson.dumps(CHAT)


@pytest.fixture(scope="module")
def analyzer() -> Analyzer:
    return Analyzer.load(AnalysisSpec(tokenizers=((DEFAULT_KEY, TOKENIZER),)))


def job(body: bytes = BODY, **fields: Any) -> AnalysisJob:
    return AnalysisJob(
        endpoint="chat", model_label=DEFAULT_LABEL, tokenizer_key=DEFAULT_KEY, body=body, **fields
    )


def json_answer(prompt: int | None, output: int, cached: int | None = None) -> bytes:
    """A chat completion's JSON body as vLLM writes it; `prompt` None: an answer without usage."""
    answer: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion", "choices": []}
    if prompt is not None:
        answer["usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": output,
            "total_tokens": prompt + output,
        }
        if cached is not None:
            answer["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}
    return orjson.dumps(answer)


def stream_usage(
    prompt: int, output: int, cached: int | None = None, reasoning: int | None = None
) -> dict[str, Any]:
    """The job fields the response path sets for an event stream (handler.py `_job`)."""
    usage = Usage(prompt, output, prompt + output, cached_tokens=cached, reasoning_tokens=reasoning)
    return {"server_tokens": prompt, "server_usage": usage, "streamed": True}


def expected_count(analyzer: Analyzer) -> int:
    """The count a faithful server reports for BODY: islwatch's own, from an answer without usage."""
    count = analyzer.analyze(job()).expected
    assert count is not None and count > 0
    return count


PLANS = build_metrics(CollectorRegistry(), process_metrics=False)


def keep(memo: OutcomeMemo, outcome: AnalysisOutcome) -> None:
    """As the pool keeps a worker's outcome: with the plan `Metrics.analysed` applied for it."""
    memo.keep(outcome, PLANS.plan(outcome))


def kept(memo: OutcomeMemo, analyzer: Analyzer, j: AnalysisJob) -> str:
    """Run `j` as the pool does on a miss (key it, a worker analyses it, the outcome comes back); its key."""
    key = memo.key(j)
    assert key is not None and memo.reuse(key, j) is None
    keep(memo, analyzer.analyze(dataclasses.replace(j, memo_key=key)))
    return key


def hit_outcome(reuse: Reuse | None) -> AnalysisOutcome:
    """What a memo hit stands for (what `Metrics.reapplied` counts): the kept outcome with this answer's
    usage and no worker time."""
    assert reuse is not None
    u = reuse.usage
    return dataclasses.replace(
        reuse.kept, seconds=0.0, output_tokens=u and u.output_tokens, cached_tokens=u and u.cached_tokens,
        reasoning_tokens=u and u.reasoning_tokens,
    )  # fmt: skip


def as_worker(analyzer: Analyzer, j: AnalysisJob, key: str) -> AnalysisOutcome:
    """What a worker would compute for `j`, with the memo's zero time (reuse takes no worker time)."""
    return dataclasses.replace(analyzer.analyze(dataclasses.replace(j, memo_key=key)), seconds=0.0)


# ---- the memo alone ---------------------------------------------------------------------------------------


def test_json_answer_with_the_kept_count_is_reused_with_its_own_usage(analyzer: Analyzer) -> None:
    n = expected_count(analyzer)
    memo = OutcomeMemo()
    key = kept(memo, analyzer, job(response_json=json_answer(n, output=16, cached=0)))
    again = job(response_json=json_answer(n, output=3, cached=8))
    assert memo.key(again) == key
    got = hit_outcome(memo.reuse(key, again))
    assert got == as_worker(analyzer, again, key)
    assert (got.match, got.server, got.output_tokens, got.cached_tokens) == ("exact", n, 3, 8)


def test_stream_usage_with_the_kept_count_is_reused_with_its_own_usage(analyzer: Analyzer) -> None:
    n = expected_count(analyzer)
    memo = OutcomeMemo()
    key = kept(memo, analyzer, job(**stream_usage(n, 16)))
    again = job(**stream_usage(n, 5, cached=4, reasoning=2))
    got = hit_outcome(memo.reuse(key, again))
    assert got == as_worker(analyzer, again, key)
    assert (got.output_tokens, got.cached_tokens, got.reasoning_tokens) == (5, 4, 2)


def test_a_kept_answer_without_usage_is_reused_for_another_without_usage(analyzer: Analyzer) -> None:
    memo = OutcomeMemo()
    key = kept(memo, analyzer, job(response_json=json_answer(None, 0)))
    again = job(response_json=b'{"id":"other","choices":[]}')
    got = hit_outcome(memo.reuse(key, again))
    assert got == as_worker(analyzer, again, key)
    assert got.match == "no_server_count" and got.output_tokens is None


@pytest.mark.parametrize("other", [1, -1, None], ids=["one-more", "one-less", "no-usage"])
def test_another_server_count_is_not_reused(analyzer: Analyzer, other: int | None) -> None:
    n = expected_count(analyzer)
    memo = OutcomeMemo()
    key = kept(memo, analyzer, job(response_json=json_answer(n, 16)))
    count = None if other is None else n + other
    assert memo.reuse(key, job(response_json=json_answer(count, 16))) is None
    assert memo.reuse(key, job(response_json=json_answer(n, 16))) is not None  # still kept for its own count


def test_a_count_where_none_was_kept_is_not_reused(analyzer: Analyzer) -> None:
    memo = OutcomeMemo()
    key = kept(memo, analyzer, job(response_json=json_answer(None, 0)))
    assert memo.reuse(key, job(response_json=json_answer(expected_count(analyzer), 16))) is None


def test_the_key_is_the_body_endpoint_tokenizer_and_stream_flag() -> None:
    memo = OutcomeMemo()
    base = job()
    answered = dataclasses.replace(base, response_json=json_answer(9, 1), model_label="other")
    assert memo.key(base) == memo.key(answered)  # neither the answer nor the label is part of it
    others = [
        job(body=BODY + b" "),
        dataclasses.replace(base, endpoint="completions"),
        dataclasses.replace(base, tokenizer_key="m2"),
        dataclasses.replace(base, streamed=True),
    ]
    keys = {memo.key(j) for j in [base, *others]}
    assert len(keys) == 1 + len(others)


def test_mismatches_errors_and_bad_bodies_are_not_kept(analyzer: Analyzer) -> None:
    n = expected_count(analyzer)
    memo = OutcomeMemo()
    cases = [
        job(response_json=json_answer(n + 1, 16)),  # a mismatch: each one reaches a worker (and its dump)
        dataclasses.replace(job(), tokenizer_key="not-loaded"),  # error: no tokenizer for it
        job(body=b'{"model":"m","messages":5}'),  # bad_reason: not a request of its endpoint
    ]
    for j in cases:
        key = memo.key(j)
        assert key is not None
        outcome = analyzer.analyze(dataclasses.replace(j, memo_key=key))
        assert outcome.match == "mismatch" or outcome.error or outcome.bad_reason
        keep(memo, outcome)
        assert memo.reuse(key, j) is None
    # An outcome that counted nothing (match None) is not kept either.
    keep(memo, AnalysisOutcome("chat", DEFAULT_LABEL, 0.001, memo_key=memo.key(job())))
    assert len(memo) == 0


def test_an_outcome_without_a_key_is_not_kept(analyzer: Analyzer) -> None:
    memo = OutcomeMemo()
    keep(memo, analyzer.analyze(job(response_json=json_answer(expected_count(analyzer), 16))))
    assert len(memo) == 0


def test_a_new_generation_forgets_kept_outcomes_and_those_still_in_flight(analyzer: Analyzer) -> None:
    n = expected_count(analyzer)
    memo = OutcomeMemo()
    answer = job(response_json=json_answer(n, 16))
    old = kept(memo, analyzer, answer)
    in_flight = memo.key(job(body=BODY + b"\n", response_json=json_answer(n, 16)))
    memo.new_generation()  # a reload, a restarted worker
    assert memo.reuse(old, answer) is None
    new = memo.key(answer)
    assert new is not None and new != old and memo.reuse(new, answer) is None
    # The outcome of a job keyed before the load comes back after it: stored, never found by a new key.
    assert in_flight is not None
    late = job(body=BODY + b"\n", response_json=json_answer(n, 16))
    keep(memo, analyzer.analyze(dataclasses.replace(late, memo_key=in_flight)))
    assert len(memo) == 1
    late_key = memo.key(late)
    assert late_key is not None and late_key != in_flight and memo.reuse(late_key, late) is None


def test_entries_are_bounded_least_recently_used_first(analyzer: Analyzer) -> None:
    n = expected_count(analyzer)
    memo = OutcomeMemo(entries=2)
    jobs = [job(body=BODY + b" " * i, response_json=json_answer(n, 16)) for i in range(3)]
    a, b = kept(memo, analyzer, jobs[0]), kept(memo, analyzer, jobs[1])
    assert memo.reuse(a, jobs[0]) is not None  # a is now the most recently used
    c = kept(memo, analyzer, jobs[2])
    assert len(memo) == 2
    assert memo.reuse(b, jobs[1]) is None
    assert memo.reuse(a, jobs[0]) is not None and memo.reuse(c, jobs[2]) is not None


def test_zero_entries_keys_nothing() -> None:
    memo = OutcomeMemo(entries=0)
    assert memo.key(job()) is None
    assert len(memo) == 0


def drift_samples(registry: CollectorRegistry) -> dict[tuple[Any, ...], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in registry.collect()
        if fam.name in ("islwatch_drift", "islwatch_isl_match", "islwatch_isl_tokens")
        for s in fam.samples
        if not s.name.endswith("_created")
    }


def test_a_new_server_parity_verdict_remakes_the_plan() -> None:
    """The drift cause label depends on the server parity verdict (causes.py `with_server_parity`), which the
    probe may change after an outcome was kept: the memo hit then counts as `analysed` would now."""
    o = AnalysisOutcome("chat", DEFAULT_LABEL, 0.0, bare=7, templated=9, expected=9, server=10,
                        match="exact", cause="bos_added", memo_key="k")  # fmt: skip
    problems = ProblemLog(logging.getLogger("test"))
    memo_side, worker_side = (build_metrics(CollectorRegistry(), process_metrics=False) for _ in range(2))
    plan = memo_side.analysed(o, problems)  # kept with the first verdict (none yet)
    worker_side.analysed(o, problems)
    assert plan is not None
    for side in (memo_side, worker_side):
        side.server_probed(DEFAULT_LABEL, False)  # the probe finds the server tokenizes differently
    remade = memo_side.reapplied(o, plan, None, problems)
    worker_side.analysed(o, problems)
    assert remade is not plan
    assert drift_samples(memo_side.registry) == drift_samples(worker_side.registry)
    causes = {dict(labels).get("cause"): v for (name, labels), v in drift_samples(worker_side.registry).items()
              if name == "islwatch_drift_total"}  # fmt: skip
    assert causes == {"bos_added": 1.0, "server_tokenizer_differs": 1.0}
    assert memo_side.reapplied(o, remade, None, problems) is remade  # the same verdict: the same plan


# ---- end to end -------------------------------------------------------------------------------------------

N = 5  # each body is sent this many times
STREAM_OPTIONS = {"stream": True, "stream_options": {"include_usage": True}}
TRAFFIC = [  # (path, body): JSON and streamed, with and without usage, two endpoints
    ("/v1/chat/completions", orjson.dumps({**CHAT, "max_tokens": 4})),
    ("/v1/chat/completions", orjson.dumps({**CHAT, **STREAM_OPTIONS, "max_tokens": 3})),
    ("/v1/chat/completions", orjson.dumps({**CHAT, "stream": True, "max_tokens": 2})),  # no usage asked
    ("/v1/completions", orjson.dumps({"model": "m", "prompt": "The sky is", "max_tokens": 5})),
    (
        "/v1/completions",
        orjson.dumps({"model": "m", "prompt": "The sea is", **STREAM_OPTIONS, "max_tokens": 2}),
    ),
]
# Families whose values are not the traffic's: the analysis time (no worker time for a reused outcome, which
# is counted instead), the process, and when each series was created.
NOT_COMPARED = (
    "islwatch_analysis_seconds",
    "islwatch_analysis_reused",
    "process_",
    "python_",
    "islwatch_build",
)


class Front:
    """The upstream's address, forwarding to one of two emulators: a server replaced behind the same URL
    (a rolling update) whose count for the same body changes."""

    def __init__(self, target: str) -> None:
        self.target = target

    def app(self) -> web.Application:
        async def forward(request: web.Request) -> web.Response:
            async with (
                aiohttp.ClientSession() as s,
                s.post(
                    self.target + request.path,
                    data=await request.read(),
                    headers={"Content-Type": "application/json"},
                ) as r,
            ):
                return web.Response(status=r.status, body=await r.read(), content_type=r.content_type)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        return app


@dataclasses.dataclass
class Upstreams:
    bg: Background
    faithful: str  # counts as vLLM does
    hidden_system: str  # a hidden 5-token system prompt: every chat count 5 more


@pytest.fixture(scope="module")
def upstreams() -> Iterator[Upstreams]:
    bg = Background()
    tok = load_tokenizer(TOKENIZER)

    @contextlib.asynccontextmanager
    async def emulator(faults: list[str]) -> AsyncIterator[str]:
        config = EmulatorConfig(tokenizer=TOKENIZER, faults=parse_faults(faults))
        runner, url = await start_emulator(config, tokenizer=tok)
        try:
            yield url
        finally:
            await runner.cleanup()

    try:
        yield Upstreams(bg, bg.enter(emulator([])), bg.enter(emulator(["system-prompt=5"])))
    finally:
        bg.close()


def start(up: Upstreams, upstream: str, **config: Any) -> tuple[str, str]:
    urls = up.bg.enter(run_proxy(proxy_config(upstream, tokenizer=TOKENIZER, server_probe="off", **config)))
    return urls.url, urls.admin_url


def analysed(m: dict[Any, float]) -> float:
    return value(m, "islwatch_analysis_seconds_count")


def reused(m: dict[Any, float]) -> float:
    return value(m, "islwatch_analysis_reused_total")


async def send(s: aiohttp.ClientSession, url: str, path: str, body: bytes) -> None:
    async with s.post(url + path, data=body, headers={"Content-Type": "application/json"}) as r:
        assert r.status == 200, await r.text()
        await r.read()


def compared(m: dict[Any, float]) -> dict[Any, float]:
    return {k: v for k, v in m.items() if not k[0].startswith(NOT_COMPARED) and not k[0].endswith("_created")}


@pytest.mark.slow  # two proxies with workers over every body
def test_repeated_bodies_are_reused_and_every_metric_equals_a_proxy_without_the_memo(
    upstreams: Upstreams,
) -> None:
    memo_url, memo_admin = start(upstreams, upstreams.faithful, analysis_mode="process")
    plain_url, plain_admin = start(upstreams, upstreams.faithful, analysis_mode="process", analysis_memo=0)

    async def go() -> tuple[dict[Any, float], dict[Any, float]]:
        async with aiohttp.ClientSession() as s:
            for i, (path, body) in enumerate(TRAFFIC):
                await send(s, memo_url, path, body)  # the first of each body goes to the worker
                await wait_metrics(s, memo_admin, lambda m, i=i: analysed(m) == i + 1 and settled(m))
                for _ in range(N - 1):
                    await send(s, memo_url, path, body)
                    await send(s, plain_url, path, body)
                await send(s, plain_url, path, body)
            total = len(TRAFFIC) * N
            with_memo = await wait_metrics(
                s, memo_admin, lambda m: analysed(m) + reused(m) == total and settled(m)
            )
            without = await wait_metrics(s, plain_admin, lambda m: analysed(m) == total and settled(m))
            return with_memo, without

    with_memo, without = upstreams.bg.run(go())
    assert reused(with_memo) == len(TRAFFIC) * (N - 1)
    assert analysed(with_memo) == len(TRAFFIC)
    assert reused(without) == 0
    # The traffic is what it says: four bodies with usage, one without.
    assert value(with_memo, "islwatch_isl_match_total", result="exact") == 4 * N
    assert value(with_memo, "islwatch_isl_match_total", result="no_server_count") == N
    assert compared(with_memo) == compared(without)


def test_a_server_count_that_changes_for_the_same_body_goes_to_a_worker(upstreams: Upstreams) -> None:
    front = Front(upstreams.faithful)
    url, admin = start(upstreams, upstreams.bg.enter(serve_app(front.app())))
    path, body = TRAFFIC[0]

    async def step(s: aiohttp.ClientSession, want_analysed: int, want_reused: int) -> dict[Any, float]:
        await send(s, url, path, body)
        return await wait_metrics(
            s, admin, lambda m: (analysed(m), reused(m)) == (want_analysed, want_reused) and settled(m)
        )

    async def go() -> dict[Any, float]:
        async with aiohttp.ClientSession() as s:
            await step(s, 1, 0)  # the first: a worker; kept (exact)
            await step(s, 1, 1)  # the same count: reused
            front.target = upstreams.hidden_system
            await step(s, 2, 1)  # 5 more: a worker, a mismatch (not kept)
            await step(s, 3, 1)  # and again: a mismatch is never reused
            front.target = upstreams.faithful
            await step(s, 3, 2)  # the kept exact outcome still holds for its own count
            async with s.post(admin + "/reload") as r:  # a load: nothing counted before it is reused
                assert r.status == 200, await r.text()
            return await step(s, 4, 2)

    m = upstreams.bg.run(go())
    assert value(m, "islwatch_isl_match_total", result="exact") == 4
    assert value(m, "islwatch_isl_match_total", result="mismatch") == 2
    assert value(m, "islwatch_drift_total", cause="hidden_system_prompt") == 2
