"""Conversations and their wire requests, each budgeted so its templated count equals its target. No I/O.

Turn 1's whole templated count is the ISL (template fixed cost, wraps, shared system prompt and marker all
included). Turn k > 1 appends the received reply and a new user message; its target is the templated count of
the history with the reply (rendered as the template renders an assistant message) plus the ISL, so each
user turn adds exactly ISL tokens to the wire request.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any

import orjson

from loadgen.config import LoadgenConfig
from loadgen.workload.anthropic import as_messages, history_of
from loadgen.workload.budget import Fit, Overhead, fit_text, solve_overhead
from loadgen.workload.corpus import Corpus, build_corpus, text_corpus
from loadgen.workload.images import image_model, image_parts, parse_size, with_images
from loadgen.workload.markers import CacheBust, Landing, apply_marker, landing, marker_for
from proxy.core.count import count_request
from proxy.core.messages import InvalidBody
from proxy.core.tokens import encode_len

log = logging.getLogger("islwatch.loadgen")
SLACK_WORDS = 64
CONVERSATIONAL = ("chat", "responses", "messages")  # the endpoints with roles, turns and a system prompt


@dataclass(frozen=True)
class Request:
    conversation: str
    turn: int  # 1-based
    body: dict[str, Any]
    wire: bytes
    turn_isl: int  # what this user turn was to add (the ISL sample)
    target_isl: int  # the whole request's templated count the budget aimed at
    client_isl: int | None  # the templated count measured on the wire body
    reply_tokens: int = 0  # the previous reply as rendered in the history (turn > 1)
    error: str | None = None
    marker: str | None = None


@dataclass
class Conversation:
    id: str
    marker: str | None
    messages: list[dict[str, Any]] = field(default_factory=list)  # the last request's messages
    turn: int = 0
    last_count: int = 0
    rng: random.Random = field(default_factory=random.Random)


class Workload:
    """Builds budgeted requests for one config and one tokenizer. Deterministic for a (seed, run id)."""

    # Whether a follow-up depends on the reply before it. When not (agent loops: synthetic assistant turns),
    # the open loop builds whole conversations before its clock starts (loadgen/send/runner.py).
    replies_used = True

    def __init__(
        self, tok: Any, cfg: LoadgenConfig, corpus: Corpus | None = None, *, served: Any = None
    ) -> None:
        self.tok = tok
        self.cfg = cfg
        # A ServedModel (core/model.py): counts through the server flavor's path (Harmony, mistral-common,
        # the processor's template); None: the reference path on `tok` (the Jinja template vLLM renders).
        self.served = served
        if cfg.endpoint == "messages" and served is None:
            # Only a served model knows how the server converts a Messages request (core/flavors/*_messages.py).
            raise ValueError("--endpoint messages counts through the served model (load_served_model)")
        self.corpus = corpus or (text_corpus(tok, cfg.corpus) if cfg.corpus else build_corpus(tok))
        self.landing = landing(cfg.cache_bust, cfg.shared_system_prompt_length > 0)
        self._warned_shape = False
        self.images = image_model(tok, cfg.mm_processor_kwargs) if cfg.images else None
        self._system_words = self.corpus.sample(
            random.Random(f"{cfg.seed}/system"), cfg.shared_system_prompt_length + SLACK_WORDS
        )
        self.system_text: str | None = None
        if cfg.shared_system_prompt_length:
            fit = self._fit_system(None)
            self.system_text = fit.text
            if fit.error:
                raise ValueError(f"shared system prompt: {fit.error}")

    # --- counting -------------------------------------------------------------------------------------
    def count(self, body: dict[str, Any], endpoint: str | None = None) -> tuple[int | None, str | None]:
        """The ISL of a body as the proxy counts it: templated for chat, plain encode otherwise. `endpoint`:
        another endpoint's body than the run's (a Messages history as the chat its server converts it into)."""
        endpoint = endpoint or self.cfg.endpoint
        if self.served is not None and self.images is None:
            r = self.served.count(endpoint, body)
        else:
            r = count_request(self.tok, endpoint, body, self.images)
        # Responses: expected_server, as vLLM encodes that prompt with special tokens (core/extract.py); when
        # the template fails it is only the bare fallback, which the server would not count. Messages: the
        # count of the chat request the server converts it into, as the server reports it.
        value = r.templated if endpoint == "chat" else r.expected_server
        if endpoint in ("responses", "messages") and r.templated is None:
            value = None
        if value is None:
            return None, f"{r.fallback_reason}{f' ({r.detail})' if r.detail else ''}"
        return value, None

    def _measure(self, body_for: Any) -> Any:
        def measure(text: str) -> int:
            value, err = self.count(body_for(text))
            if value is None:
                raise _Uncountable(err or "uncountable")
            return value

        return measure

    # --- bodies -----------------------------------------------------------------------------------------
    def _body(self, messages_or_text: Any, osl: int | None = None) -> dict[str, Any]:
        c = self.cfg
        body: dict[str, Any] = {"model": c.model}
        if c.endpoint == "chat":
            body["messages"] = messages_or_text
        elif c.endpoint == "completions":
            body["prompt"] = messages_or_text
        elif c.endpoint == "responses":
            # Responses API: `input` items, `max_output_tokens`; usage rides on `response.completed`.
            body["input"] = messages_or_text
            body["max_output_tokens"] = osl or c.osl
            if c.streaming:
                body["stream"] = True
            return body
        elif c.endpoint == "messages":
            # Anthropic's Messages API: the system prompt as the top-level `system`, tool calls and results as
            # blocks (loadgen/workload/anthropic.py), `max_tokens` required; usage rides on message_start.
            system, messages = as_messages(messages_or_text)
            if system is not None:
                body["system"] = system
            body["messages"] = messages
            body["max_tokens"] = osl or c.osl
            if c.streaming:
                body["stream"] = True
            return body
        else:
            return {"model": c.model, "input": messages_or_text}
        body["max_tokens"] = osl or c.osl
        if c.ignore_eos:
            body["ignore_eos"] = True  # vLLM / SGLang extension: generate exactly max_tokens
        if c.streaming:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}  # usage in the last chunk (OpenAI API)
        return body

    def chat(self, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        """A body holding only `messages` (for counting), in this endpoint's field; a Messages body whole (its
        request model needs `model` and `max_tokens`)."""
        if self.cfg.endpoint == "messages":
            return {**self._body(messages), **extra}
        return {("input" if self.cfg.endpoint == "responses" else "messages"): messages, **extra}

    def _assistant(self, conv: Conversation, reply: str) -> dict[str, Any]:
        if self.cfg.endpoint != "responses":
            return {"role": "assistant", "content": reply}
        # The Responses API takes the previous answer back as its output message item (llama-server refuses a
        # plain assistant message: "Cannot determine type of 'item'"); the template sees the same text.
        part = {"type": "output_text", "text": reply, "annotations": []}
        return {"type": "message", "id": f"msg_{conv.id}_{conv.turn}", "role": "assistant", "status": "completed",
                "content": [part]}  # fmt: skip

    def offsets(self, worker: int, workers: int) -> list[float] | None:
        """A workload with its own send times (a trace) returns this worker's; None: the load shape decides."""
        return None

    def _user_content(self, text: str, marker: str | None) -> Any:
        content: Any = [{"type": "text", "text": text}] if self.cfg.content_parts else text
        if marker is None:
            return content
        return self.mark(content, marker)

    def mark(self, content: Any, marker: str) -> Any:
        """Content with the marker added; an unknown content shape is left alone, with one warning per run."""
        marked, applied = apply_marker(content, marker, self.cfg.cache_bust.prefix)
        if not applied and not self._warned_shape:
            self._warned_shape = True
            log.warning("cache-bust: unknown content shape %s, no marker added", type(content).__name__)
        return marked

    def _fit_system(self, marker: str | None) -> Fit:
        n = self.cfg.shared_system_prompt_length
        prefix = self.cfg.cache_bust.prefix

        def measure(text: str) -> int:
            content = apply_marker(text, marker, prefix)[0] if marker else text
            return encode_len(self.tok, content, add_special_tokens=False)

        return fit_text(measure, n, self._system_words, self.corpus.fillers)

    def _system_message(self, marker: str | None) -> tuple[dict[str, Any] | None, str | None]:
        if self.system_text is None:
            return None, None
        if marker is None:
            return {"role": "system", "content": self.system_text}, None
        # The wire system message stays N tokens: the shared text is rebuilt shorter around the marker.
        fit = self._fit_system(marker)
        content = apply_marker(fit.text, marker, self.cfg.cache_bust.prefix)[0]
        return {"role": "system", "content": content}, (f"system prompt: {fit.error}" if fit.error else None)

    def _turn_isl(self, conv: Conversation) -> int:
        if not self.cfg.isl_stddev:
            return self.cfg.isl
        return max(1, round(conv.rng.gauss(self.cfg.isl, self.cfg.isl_stddev)))

    # --- conversations ----------------------------------------------------------------------------------
    def start(self, conversation_id: str) -> tuple[Conversation, Request]:
        c = self.cfg
        marker = marker_for(c.run_id, conversation_id) if c.cache_bust is not CacheBust.NONE else None
        conv = Conversation(conversation_id, marker, rng=random.Random(f"{c.seed}/{conversation_id}"))
        isl = self._turn_isl(conv)
        if c.endpoint not in CONVERSATIONAL:
            return conv, self._finish(conv, isl, isl, 0, self._body, None)
        system, sys_err = self._system_message(marker if self.landing is Landing.SYSTEM else None)
        head = [system] if system else []
        user_marker = marker if self.landing is Landing.FIRST_USER else None
        images = image_parts(c.images, parse_size(c.image_size), conv.rng) if c.images else []

        def body_for(text: str) -> dict[str, Any]:
            content = with_images(self._user_content(text, user_marker), images)
            return self._body([*head, {"role": "user", "content": content}])

        return conv, self._finish(conv, isl, isl, 0, body_for, sys_err)

    def follow_up(self, conv: Conversation, reply: str) -> Request:
        """The next turn: the history, the reply just received, and a new user message of ISL tokens."""
        history = [*conv.messages, self._assistant(conv, reply)]
        with_reply, err = self._history_count(history)
        isl = self._turn_isl(conv)
        if with_reply is None:
            return self._failed(conv, isl, conv.last_count + isl, f"history uncountable: {err}")

        def body_for(text: str) -> dict[str, Any]:
            return self._body([*history, {"role": "user", "content": self._user_content(text, None)}])

        return self._finish(conv, isl, with_reply + isl, with_reply - conv.last_count, body_for, None)

    def _history_count(self, history: list[dict[str, Any]]) -> tuple[int | None, str | None]:
        """The templated count of a history ending with the reply, as the next request renders it."""
        endpoint: str | None = None  # the run's
        if self.cfg.endpoint == "messages":
            # A Messages request has no add_generation_prompt (a final assistant turn is a prefill): the history
            # is the chat request the server converts it into, counted as a chat without the generation prompt.
            try:
                chat = self.served.flavor.messages_as_chat(self._body(history), False, self.served)
            except InvalidBody as exc:
                return None, str(exc)
            body, endpoint = {**chat, "add_generation_prompt": False}, "chat"
        else:
            body = self.chat(history, add_generation_prompt=False)
        value, err = self.count(body, endpoint)
        if value is None and self.served is not None and self.served.mistral is not None:
            # mistral-common takes a final assistant message only as a prefix to continue; in a history the
            # reply is that prefix closed by its EOS (one token).
            prefix, _ = self.count({**body, "continue_final_message": True}, endpoint)
            if prefix is not None:
                return prefix + 1, None
        return value, err

    def _finish(
        self, conv: Conversation, isl: int, target: int, reply_tokens: int, body_for: Any, prior: str | None,
        words: list[str] | None = None,
    ) -> Request:  # fmt: skip
        conv.turn += 1
        if words is None:
            words = self.corpus.sample(conv.rng, target + SLACK_WORDS)
        try:
            fit = fit_text(self._measure(body_for), target, words, self.corpus.fillers)
        except _Uncountable as exc:
            return self._failed(conv, isl, target, f"uncountable request: {exc}", advance=False)
        body = body_for(fit.text)
        wire = orjson.dumps(body)
        # The number we report is measured on the bytes we send, not on the dict we built.
        client, err = self.count(orjson.loads(wire))
        error = prior or fit.error or err
        if error is None and client != target:
            error = f"measured {client} on the wire, budgeted {target}"
        if self.cfg.endpoint == "messages":
            conv.messages = history_of(body)  # the chat form's leading system message, then the body's
        elif self.cfg.endpoint in CONVERSATIONAL:
            conv.messages = body["messages" if self.cfg.endpoint == "chat" else "input"]
        conv.last_count = client or target
        return Request(conv.id, conv.turn, body, wire, isl, target, client, reply_tokens, error, conv.marker)

    def _failed(self, conv: Conversation, isl: int, target: int, error: str, advance: bool = True) -> Request:
        if advance:
            conv.turn += 1
        return Request(conv.id, conv.turn, {}, b"", isl, target, None, 0, error, conv.marker)

    # --- overhead (printed at start) ---------------------------------------------------------------------
    def overhead(self) -> Overhead:
        """Fixed and per-message template cost, solved from 1- and 3-message renders; marker mean of 8."""
        rng = random.Random(f"{self.cfg.seed}/overhead")
        samples = [" ".join(self.corpus.sample(rng, n)) for n in (16, 32, 48)]
        bare = [encode_len(self.tok, s, add_special_tokens=False) for s in samples]
        if self.cfg.endpoint not in CONVERSATIONAL:
            fixed = sum(encode_len(self.tok, s, True) - b for s, b in zip(samples, bare, strict=True)) / 3
            return Overhead(fixed=fixed, wrap=0.0, marker=0.0)
        one, three = [], []
        for s, b in zip(samples, bare, strict=True):
            t1, _ = self.count(self.chat([{"role": "user", "content": s}]))
            msgs = [{"role": "user", "content": s}, {"role": "assistant", "content": s}]
            t3, _ = self.count(self.chat([*msgs, {"role": "user", "content": s}]))
            if t1 is None or t3 is None:
                return Overhead(fixed=float("nan"), wrap=float("nan"), marker=float("nan"))
            one.append((t1, b))
            three.append((t3, 3 * b))
        fixed, wrap = solve_overhead(one, three)
        costs = []
        plain = one[0][0]
        for i in range(8):
            marked = apply_marker(samples[0], marker_for(self.cfg.run_id, f"overhead-{i}"), True)[0]
            t, _ = self.count(self.chat([{"role": "user", "content": marked}]))
            costs.append((t or plain) - plain)
        return Overhead(fixed=fixed, wrap=wrap, marker=sum(costs) / len(costs))

    def preflight(self) -> Request:
        """Build one first turn before any request is sent; a config the template cannot meet fails here."""
        _, req = self.start("preflight")
        if req.error:
            hint = ""
            if "template_error" in req.error and self.system_text is not None:
                hint = " (does the chat template accept a system message? Mistral v0.1's does not)"
            raise ValueError(f"cannot build a request for this configuration: {req.error}{hint}")
        return req


class _Uncountable(Exception):
    """The counting core fell back (e.g. the template raised); the request cannot be budgeted."""
