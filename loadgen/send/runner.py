"""The I/O side: send budgeted requests over aiohttp on a closed- or open-loop schedule and time them.

Bodies are serialized once when built (orjson); the open loop computes its whole arrival schedule up front
and pre-builds first turns before the clock starts, so a slow response or a slow build never delays a send.
A workload whose follow-ups ignore the replies (agent loops) has its whole conversations built then too:
budgeting a 4,000-token agent round takes ~20 ms, which on the sending loop held one worker to ~40 req/s.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable

import aiohttp
from yarl import URL

from loadgen.config import LoadgenConfig
from loadgen.send.replies import Outcome, Record, StreamTimer, failed, json_outcome
from loadgen.shards import share
from loadgen.workload.arrivals import open_loop_offsets, user_starts
from loadgen.workload.conversations import Conversation, Request, Workload
from proxy.runtime.heap import few_collections
from proxy.runtime.pooled import PoolMarkingConnector, forget_pooled, pooled, retryable

JSON_HEADERS = {"Content-Type": "application/json"}
ANTHROPIC_VERSION = "2023-06-01"  # the Messages API version header every Anthropic client sends


def session_headers(cfg: LoadgenConfig) -> dict[str, str] | None:
    """The headers of every request: the bearer token; on the Messages API also Anthropic's `x-api-key` and
    `anthropic-version` (vLLM reads the bearer token, Anthropic-style gateways the other two)."""
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    if cfg.endpoint == "messages":
        headers["anthropic-version"] = ANTHROPIC_VERSION
        if cfg.api_key:
            headers["x-api-key"] = cfg.api_key
    return headers or None


async def send(session: aiohttp.ClientSession, url: URL, req: Request, cfg: LoadgenConfig) -> Outcome:
    for attempt in (1, 2):
        start = time.perf_counter()
        forget_pooled()  # set by the session's PoolMarkingConnector when the request gets a pooled connection
        answered = False
        try:
            async with session.post(url, data=req.wire, headers=JSON_HEADERS) as resp:
                answered = True
                if cfg.streaming and resp.status == 200:
                    timer = StreamTimer()
                    async for line in resp.content:
                        timer.feed_line(line, time.perf_counter())
                    return timer.outcome(start, time.perf_counter())
                raw = await resp.read()
                end = time.perf_counter()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            # A kept-alive connection the server had closed (llama-server does after a stream): the request
            # never reached it, so it goes once more on a new connection, as the proxy does (upstream.py).
            if attempt == 1 and not answered and retryable(exc, pooled(), req.wire):
                continue
            return failed(type(exc).__name__)
        return json_outcome(resp.status, raw, (end - start) * 1000)
    raise AssertionError("unreachable")


class Engine:
    """Runs conversations for one process: closed loop (N users) or open loop (a precomputed schedule)."""

    def __init__(
        self,
        cfg: LoadgenConfig,
        workload: Workload,
        worker: int = 0,
        workers: int = 1,
        on_done: Callable[[Record], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.workload = workload
        self.worker = worker
        self.workers = workers
        self.on_done = on_done
        self.records: list[Record] = []
        self._next_conv = 0
        self._session: aiohttp.ClientSession | None = None
        self._url = URL(cfg.endpoint_url)  # parsed once, not on every request

    # --- shares of the whole run for this worker ---------------------------------------------------------
    def _share(self, total: int) -> int:
        return share(total, self.worker, self.workers)  # a sender's part (loadgen/shards.py)

    def new_conversation(self, prefix: str = "c") -> tuple[Conversation, Request]:
        cid = f"{prefix}{self._next_conv * self.workers + self.worker}"
        self._next_conv += 1
        return self.workload.start(cid)

    def whole_conversation(self) -> tuple[Conversation, Request, deque[Request]]:
        """A new conversation's first request and every follow-up, built now (replies unused): the same
        requests `follow_up` would build as the replies come, since a conversation's rng is its own."""
        conv, first = self.new_conversation()
        rest: deque[Request] = deque()
        last = first
        while last.wire and last.turn < self.cfg.turns:
            last = self.workload.follow_up(conv, "")
            rest.append(last)
        return conv, first, rest

    async def run(self, ready: Callable[[], None] | None = None) -> list[Record]:
        c = self.cfg
        connector = PoolMarkingConnector(limit=0, ttl_dns_cache=300)
        timeout = aiohttp.ClientTimeout(total=c.timeout_seconds)
        headers = session_headers(c)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:
            self._session = session
            if c.warmup:
                await self._warmup(self._share(c.warmup))
            if c.request_rate is not None or c.trace is not None:  # a trace brings its own send times
                await self._open_loop(ready)
            else:
                if ready:
                    ready()
                await self._closed_loop(self._share(c.concurrency or 1))
        return self.records

    async def execute(
        self, conv: Conversation, req: Request, warmup: bool = False, scheduled: float | None = None
    ) -> str | None:
        """Send one request (unless it could not be built), record it, return the reply text."""
        sent = time.monotonic()
        if req.wire:
            assert self._session is not None
            out = await send(self._session, self._url, req, self.cfg)
        else:
            out = failed("not sent")
        rec = Record(
            conversation=conv.id,
            turn=req.turn,
            warmup=warmup,
            turn_isl=req.turn_isl,
            target_isl=req.target_isl,
            client_isl=req.client_isl,
            server_prompt_tokens=out.prompt_tokens,
            reply_tokens=req.reply_tokens,
            output_tokens=out.output_tokens,
            status=out.status,
            error=out.error,
            budget_error=req.error,
            sent_at=sent,
            scheduled_at=scheduled,
            send_lateness_ms=None if scheduled is None else max(0.0, (sent - scheduled) * 1000),
            latency_ms=out.latency_ms,
            ttft_ms=out.ttft_ms,
            itl_ms=out.itl_ms,
            cached_prompt_tokens=out.cached_tokens,
        )
        self.records.append(rec)
        if self.on_done and not warmup:
            self.on_done(rec)
        return out.reply if out.error is None else None

    async def _warmup(self, n: int) -> None:
        todo = iter(range(n))

        async def user() -> None:
            for _ in todo:
                conv, req = self.new_conversation("w")
                await self.execute(conv, req, warmup=True)

        await asyncio.gather(*(user() for _ in range(min(n, self.cfg.concurrency or 8) or 1)))
        self._next_conv = 0

    def _more(self, sent: int, started: float) -> bool:
        c = self.cfg
        if c.request_count is not None:
            return sent < self._share(c.request_count)
        return time.monotonic() - started < (c.duration or 0)

    async def _closed_loop(self, users: int) -> None:
        started = time.monotonic()
        sent = 0

        def take() -> bool:
            nonlocal sent
            if not self._more(sent, started):
                return False
            sent += 1
            return True

        async def user(delay: float) -> None:
            if delay:  # a concurrency ramp: this user joins later
                await asyncio.sleep(delay)
            while take():
                conv, req = self.new_conversation()
                while True:
                    reply = await self.execute(conv, req)
                    if reply is None or req.wire == b"" or conv.turn >= self.cfg.turns or not take():
                        break
                    req = self.workload.follow_up(conv, reply)

        last = self._share(int(self.cfg.ramp_to)) if self.cfg.ramp_to else users
        await asyncio.gather(*(user(d) for d in user_starts(self.cfg, users, last)))

    def _slots(self) -> list[float]:
        own = self.workload.offsets(self.worker, self.workers)
        if own is not None:
            return own
        count = self.cfg.request_count
        share = None if count is None else self._share(count)
        return open_loop_offsets(self.cfg, self.worker, self.workers, share)

    async def _open_loop(self, ready: Callable[[], None] | None) -> None:
        slots = self._slots()
        turns = self.cfg.turns
        # First turns are built before the clock starts; later turns when their reply arrives, unless the
        # workload ignores replies: then whole conversations, as many as the schedule is likely to start.
        ahead: dict[str, deque[Request]] = {}
        prebuilt: deque[tuple[Conversation, Request]] = deque()
        if turns > 1 and not self.workload.replies_used:
            for _ in range(whole_conversations(len(slots), turns)):
                conv, req, rest = self.whole_conversation()
                prebuilt.append((conv, req))
                ahead[conv.id] = rest
        else:
            prebuilt.extend(
                self.new_conversation() for _ in range(len(slots) if turns == 1 else min(len(slots), 64))
            )
        follow_ups: deque[tuple[Conversation, Request]] = deque()
        tasks: set[asyncio.Task[None]] = set()

        def next_of(conv: Conversation, reply: str) -> Request:
            rest = ahead.get(conv.id)
            return rest.popleft() if rest else self.workload.follow_up(conv, reply)

        async def one(conv: Conversation, req: Request, at: float) -> None:
            reply = await self.execute(conv, req, scheduled=at)
            if reply is not None and req.wire and req.turn < turns:
                follow_ups.append((conv, next_of(conv, reply)))

        with few_collections():  # the prebuilt requests and the records piling up: out of the GC's way
            if ready:
                ready()
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            m0 = time.monotonic()
            for offset in slots:
                delay = t0 + offset - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if follow_ups:
                    conv, req = follow_ups.popleft()
                elif prebuilt:
                    conv, req = prebuilt.popleft()
                else:
                    conv, req = self.new_conversation()
                task = asyncio.create_task(one(conv, req, m0 + offset))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.gather(*list(tasks))


def whole_conversations(slots: int, turns: int) -> int:
    """Conversations to build ahead for an open loop of `slots` sends of `turns`-request conversations: a
    quarter (and 8) more than fast replies would use, for those a slow reply leaves waiting while the
    schedule starts new ones. Past them a conversation is built on the sending loop as its replies come."""
    return min(slots, math.ceil(slots / turns * 1.25) + 8)
