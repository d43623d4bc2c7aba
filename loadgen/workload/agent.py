"""`--workload agent`: synthetic agent loops, each request at an exact templated count. Pure (no I/O).

A conversation is the shared system prompt (when given) + one user message + N rounds; its request k
(1-based) carries k - 1 rounds, so a conversation sends N + 1 requests, each extending the one before (the
long reused prefix of a real agent loop). A round is an assistant turn with reasoning text and 1 to
`--parallel-calls` calls of the `--tools` function schemas (sent as `tools`), then one tool result per call.

Budget: the first request is exactly `--isl` tokens (template, tools, system prompt and marker included);
request k is exactly `isl + (k - 1) * round_isl`, counted as the server counts the whole request: through
islwatch's one counting path with the server's flavor (core/model.py: Qwen3's template keeps reasoning after
the last user turn, gpt-oss renders Harmony, ...). Only the newest round's last tool result is fitted
(loadgen/workload/budget.py); every earlier message is kept as sent, so a template that re-renders history
(drops reasoning before a later user turn, say) still lands exactly on the target.

The server's replies are not used: the assistant turns are synthetic, so a conversation can be built ahead
of time (`conversation_requests`), e.g. to check each request against a server's usage.

The round's shape is built for the family: the first of SHAPES whose template renders it and counts the
tool result (probed once). Templates that refuse the tool role or insist on alternating user/assistant
turns (Mistral v0.1, Gemma 3) get the round as text: the assistant's reasoning and calls in its content, the
results in a user message.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import orjson

from loadgen.config import LoadgenConfig
from loadgen.workload.anthropic import anthropic_tools
from loadgen.workload.conversations import SLACK_WORDS, Conversation, Request, Workload
from loadgen.workload.corpus import Corpus

# Share of a round's tokens (roughly) spent on reasoning and on the results before the fitted last one; the
# ladder shrinks them when a small --round-isl cannot hold them plus the template's cost per call.
REASONING_SHARE = 0.2
EARLY_RESULTS_SHARE = 0.4
SCALES = (1.0, 0.5, 0.25, 0.0)
SLOT_ROOM = 4  # tokens a round leaves its fitted last result, when a smaller round can
ID_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789"


class Shape(StrEnum):
    NATIVE = "native"  # content null, reasoning_content, tool_calls; role tool results
    NATIVE_EMPTY = "native_empty_content"  # the same with content "" (templates that concatenate content)
    REASONING_IN_CONTENT = "reasoning_in_content"  # no reasoning field (mistral-common refuses it in history)
    CALLS_ONLY = "calls_only"  # no text beside the calls (mistral-common's v3 format, Mistral Nemo's)
    TEXT = "text"  # all as text: assistant content, results in a user message


SHAPES = tuple(Shape)


def _param(kind: str, description: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "description": description, **extra}


# Function schemas of the size agent frameworks send (a sentence or two of description, 2-5 parameters).
_TOOLS: tuple[tuple[str, str, dict[str, dict[str, Any]], tuple[str, ...]], ...] = (
    ("search_web", "Search the web and return the top results with their titles, URLs and snippets. Use it "
     "for facts that may have changed since training.",
     {"query": _param("string", "The search query, in natural language."),
      "max_results": _param("integer", "How many results to return (1-10).", minimum=1, maximum=10),
      "recency_days": _param("integer", "Only results newer than this many days; omit for any age.")},
     ("query",)),
    ("read_file", "Read a text file from the workspace and return its contents, optionally a line range.",
     {"path": _param("string", "Path of the file, relative to the workspace root."),
      "start_line": _param("integer", "First line to return (1-based)."),
      "end_line": _param("integer", "Last line to return (inclusive).")},
     ("path",)),
    ("write_file", "Create or overwrite a file in the workspace with the given contents.",
     {"path": _param("string", "Path of the file, relative to the workspace root."),
      "contents": _param("string", "The full new contents of the file."),
      "create_dirs": _param("boolean", "Create missing parent directories.")},
     ("path", "contents")),
    ("run_shell", "Run a shell command in the sandbox and return its exit code, stdout and stderr. Commands "
     "time out after the given number of seconds.",
     {"command": _param("string", "The command line to run with bash -lc."),
      "timeout_s": _param("integer", "Seconds before the command is killed.", minimum=1, maximum=600),
      "workdir": _param("string", "Directory to run in, relative to the workspace root.")},
     ("command",)),
    ("query_database", "Run a read-only SQL query against the analytics database and return the rows as JSON.",
     {"sql": _param("string", "A single SELECT statement."),
      "limit": _param("integer", "Maximum rows to return.", minimum=1, maximum=1000),
      "database": _param("string", "Which database to query.", enum=["events", "billing", "users"])},
     ("sql",)),
    ("get_weather", "Get the current weather and a short forecast for a location.",
     {"location": _param("string", "City and country, e.g. Paris, France."),
      "unit": _param("string", "Temperature unit.", enum=["celsius", "fahrenheit"]),
      "days": _param("integer", "Days of forecast to include (0-7).", minimum=0, maximum=7)},
     ("location",)),
    ("send_email", "Send an email on the user's behalf. Only call this after the user has confirmed the text.",
     {"to": _param("array", "Recipient addresses.", items={"type": "string"}),
      "subject": _param("string", "Subject line."),
      "body": _param("string", "Plain-text body of the message.")},
     ("to", "subject", "body")),
    ("create_ticket", "Open a ticket in the issue tracker and return its id and URL.",
     {"title": _param("string", "A one-line summary of the problem."),
      "description": _param("string", "What happened, what was expected, and how to reproduce it."),
      "priority": _param("string", "Ticket priority.", enum=["low", "medium", "high", "urgent"]),
      "labels": _param("array", "Labels to attach.", items={"type": "string"})},
     ("title", "description")),
)  # fmt: skip


def tool_schemas(k: int) -> list[dict[str, Any]]:
    """`k` OpenAI function tools of realistic size; past the built-in ones, names get a numeric suffix."""
    out = []
    for i in range(k):
        name, description, props, required = _TOOLS[i % len(_TOOLS)]
        suffix = f"_{i // len(_TOOLS) + 1}" if i >= len(_TOOLS) else ""
        params = {"type": "object", "properties": props, "required": list(required)}
        out.append({"type": "function", "function": {"name": name + suffix, "description": description,
                                                     "parameters": params}})  # fmt: skip
    return out


def call_arguments(tool: dict[str, Any], words: Callable[[int], str], rng: random.Random) -> str:
    """A JSON arguments string for the tool's required parameters, values drawn from the corpus."""
    params = tool["function"]["parameters"]
    args: dict[str, Any] = {}
    for name in params["required"]:
        spec = params["properties"][name]
        if "enum" in spec:
            args[name] = rng.choice(spec["enum"])
        elif spec["type"] == "integer":
            args[name] = rng.randint(spec.get("minimum", 1), spec.get("maximum", 50))
        elif spec["type"] == "array":
            args[name] = [words(2)]
        else:
            args[name] = words(rng.randint(2, 6))
    return orjson.dumps(args).decode()


def call_id(rng: random.Random) -> str:
    """Nine lower-case alphanumerics: what every server keeps as is (vLLM's Mistral path cuts ids to 9)."""
    return "".join(rng.choice(ID_CHARS) for _ in range(9))


@dataclass(frozen=True)
class Round:
    """One round before its last tool result is fitted."""

    reasoning: str
    calls: tuple[dict[str, Any], ...]  # OpenAI `tool_calls` entries
    results: tuple[str, ...]  # the results of every call but the last


def round_messages(shape: Shape, rnd: Round, last_result: str) -> list[dict[str, Any]]:
    """The round's wire messages in `shape`, the last call's result being `last_result`."""
    results = [*rnd.results, last_result]
    if shape is Shape.TEXT:
        calls = "\n".join(
            orjson.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]}).decode()
            for c in rnd.calls
        )
        assistant = {"role": "assistant", "content": f"{rnd.reasoning}\n{calls}" if rnd.reasoning else calls}
        return [assistant, {"role": "user", "content": "\n\n".join(results)}]
    msg: dict[str, Any] = {"role": "assistant", "tool_calls": list(rnd.calls)}
    if shape is Shape.REASONING_IN_CONTENT:
        msg["content"] = rnd.reasoning
    elif shape is Shape.CALLS_ONLY:
        msg["content"] = None
    else:
        msg["content"] = None if shape is Shape.NATIVE else ""
        msg["reasoning_content"] = rnd.reasoning
    tools = [
        {"role": "tool", "tool_call_id": c["id"], "content": r}
        for c, r in zip(rnd.calls, results, strict=True)
    ]
    return [msg, *tools]


class AgentWorkload(Workload):
    """Agent conversations for one config and one served model (`served`: core/model.py's ServedModel, whose
    flavor counts; None: the reference counting path on `tok`). Deterministic for a (seed, run id)."""

    replies_used = False  # the assistant turns are synthetic: a conversation can be built ahead of its sends

    def __init__(
        self, tok: Any, cfg: LoadgenConfig, served: Any = None, corpus: Corpus | None = None
    ) -> None:
        self.tools = tool_schemas(cfg.tools)
        # On --endpoint messages the tools go as Anthropic tools and each round's calls and results as
        # tool_use and tool_result blocks (loadgen/workload/anthropic.py); the shape is probed through the
        # server's conversion of them, so the per-round targets hold on the chat it renders.
        self.wire_tools = anthropic_tools(self.tools) if cfg.endpoint == "messages" else self.tools
        super().__init__(tok, cfg, corpus, served=served)
        self.shape, self.max_calls = self._probe_shape()

    def _body(self, messages_or_text: Any, osl: int | None = None) -> dict[str, Any]:
        body = super()._body(messages_or_text, osl)
        body["tools"] = self.wire_tools
        return body

    # --- the round ----------------------------------------------------------------------------------------
    def _words(self, rng: random.Random) -> Callable[[int], str]:
        return lambda n: " ".join(self.corpus.sample(rng, n))

    def _round(self, rng: random.Random, scale: float, calls: int) -> Round:
        size = self.cfg.round_isl
        words = self._words(rng)
        picked = [self.tools[i] for i in rng.sample(range(len(self.tools)), calls)]
        tool_calls = tuple(
            {"id": call_id(rng), "type": "function",
             "function": {"name": t["function"]["name"], "arguments": call_arguments(t, words, rng)}}
            for t in picked
        )  # fmt: skip
        early = round(size * EARLY_RESULTS_SHARE * scale / calls)
        return Round(
            reasoning=words(round(size * REASONING_SHARE * scale)),
            calls=tool_calls,
            results=tuple(words(early) for _ in range(calls - 1)),
        )

    def _probe_shape(self) -> tuple[Shape, int]:
        """The first shape the template renders with two rounds and whose tool result reaches the count, with
        parallel calls if it takes them (Llama 3.1's template refuses more than one call per turn)."""
        rng = random.Random(f"{self.cfg.seed}/agent-probe")
        user = {"role": "user", "content": "the"}
        tried = []
        for shape in SHAPES:
            for calls in sorted({min(2, self.cfg.parallel_calls), 1}, reverse=True):
                # Some reasoning: a format may take the calls alone but refuse text beside them.
                first = replace(self._round(rng, 0.0, calls), reasoning="the")
                second = replace(self._round(rng, 0.0, 1), reasoning="the")
                msgs = [user, *round_messages(shape, first, "the")]
                short, _ = self.count(self._body([*msgs, *round_messages(shape, second, "the")]))
                long, err = self.count(self._body([*msgs, *round_messages(shape, second, "the " * 8)]))
                if short is not None and long is not None and long > short:
                    return shape, (self.cfg.parallel_calls if calls > 1 else 1)
                tried.append(f"{shape} x{calls}: {err or 'the tool result does not reach the count'}")
        raise ValueError("no agent round shape renders with this chat template (" + "; ".join(tried) + ")")

    # --- conversations ------------------------------------------------------------------------------------
    def follow_up(self, conv: Conversation, reply: str) -> Request:
        """The next round appended to the last request (the reply is not used: the loop is synthetic)."""
        c = self.cfg
        history = list(conv.messages)
        target = c.isl + conv.turn * c.round_isl
        calls = conv.rng.randint(1, self.max_calls)
        rnd_seed = conv.rng.random()
        body_for = fits = None
        # Smaller rounds until one fits: less reasoning and fewer early results, then one call (a call costs
        # ~40 tokens in mistral-common's formats, which carry its id and arguments in the history). A round
        # that leaves its last result fewer than SLOT_ROOM tokens is kept only when no smaller one leaves more:
        # the result's first word may cost two (Gemma 3's round as text: 1 short of the target, every word +2).
        for n, scale in [(calls, s) for s in SCALES] + [(1, s) for s in SCALES if calls > 1]:
            rnd = self._round(random.Random(rnd_seed), scale, n)
            candidate = self._round_body(history, rnd)
            floor, err = self.count(candidate(""))
            if floor is None:
                return self._failed(conv, c.round_isl, target, f"uncountable round: {err}")
            body_for = candidate
            if floor <= target:
                fits = fits or candidate
            if floor + SLOT_ROOM <= target:
                break
        else:
            body_for = fits or body_for
        words = self.corpus.sample(conv.rng, c.round_isl + SLACK_WORDS)
        return self._finish(conv, c.round_isl, target, 0, body_for, None, words=words)

    def _round_body(self, history: list[dict[str, Any]], rnd: Round) -> Callable[[str], dict[str, Any]]:
        def body_for(text: str) -> dict[str, Any]:
            return self._body([*history, *round_messages(self.shape, rnd, text)])

        return body_for


def conversation_requests(workload: AgentWorkload, conversation_id: str) -> list[Request]:
    """Every request of one agent conversation, built ahead of time (first request, then one per round)."""
    conv, req = workload.start(conversation_id)
    out = [req]
    while conv.turn <= workload.cfg.agent_rounds and not out[-1].error:
        out.append(workload.follow_up(conv, ""))
    return out
