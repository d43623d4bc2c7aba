"""`--dataset FILE`: a JSONL file of requests, each sent at an exact count when it asks for one. No I/O but
reading the file.

A line is `{"messages": [...]}` (chat, responses, messages: there rewritten into Anthropic's form,
loadgen/workload/anthropic.py) or `{"prompt": "..."}` (completions; on the others it becomes one user
message), with optional `isl` (the whole request's count as the server counts it, template included), `osl`
(max_tokens) and `tools` (function schemas, sent as the request's `tools`).
`--isl` is the ISL of records without one; with neither, the record goes out as written and its own count is
its target. Other keys are ignored (not sent). Agent conversations come in OpenAI's format: assistant
messages with `tool_calls` and `reasoning_content` (or `reasoning`), `tool` messages with the results; they
are counted as the server flavor counts them (`--server-flavor`, core/model.py), reasoning and tools included.

Hitting an ISL reuses the synthetic budgeting (loadgen/workload/budget.py): the text slot (the last message's string
content or its last text part, or for a conversation ending on bare tool calls the last text before them;
the prompt) becomes the longest run of its own words, then corpus words,
whose measured count of the whole wire body equals the target, so a longer record loses its tail and a
shorter one gains filler after its text.
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson

from loadgen.config import LoadgenConfig
from loadgen.workload.anthropic import anthropic_tools
from loadgen.workload.conversations import SLACK_WORDS, Conversation, Request, Workload
from loadgen.workload.corpus import Corpus

T = TypeVar("T")

_INDEX = re.compile(r"(\d+)$")


@dataclass(frozen=True)
class DatasetRecord:
    messages: list[dict[str, Any]] | None
    prompt: str | None
    isl: int | None
    osl: int | None
    tools: list[dict[str, Any]] | None = None  # function schemas, sent as the request's `tools`


def _count_field(obj: dict[str, Any], key: str, where: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{where}: {key} must be a positive integer")
    return value


def parse_record(obj: Any, where: str) -> DatasetRecord:
    """One JSONL object; errors name the line, never its text."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: not a JSON object")
    messages, prompt = obj.get("messages"), obj.get("prompt")
    if (messages is None) == (prompt is None):
        raise ValueError(f"{where}: give exactly one of messages or prompt")
    if messages is not None and not (
        isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages)
    ):
        raise ValueError(f"{where}: messages must be a non-empty list of objects")
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError(f"{where}: prompt must be a string")
    tools = obj.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise ValueError(f"{where}: tools must be a list of objects")
    isl, osl = _count_field(obj, "isl", where), _count_field(obj, "osl", where)
    return DatasetRecord(messages, prompt, isl, osl, tools)


def load_jsonl(path: Path, flag: str, parse: Callable[[Any, str], T]) -> list[T]:
    """Each non-blank line of a JSONL file, parsed as JSON and then by `parse(obj, where)`; a ValueError
    naming the flag, the file and the line for anything else, or for a file with no records."""
    records = []
    with path.open("rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                raise ValueError(f"{flag} {path} line {n}: not JSON") from None
            records.append(parse(obj, f"{flag} {path} line {n}"))
    if not records:
        raise ValueError(f"{flag} {path}: no records")
    return records


def load_dataset(path: Path) -> list[DatasetRecord]:
    return load_jsonl(path, "--dataset", parse_record)


def record_index(conversation_id: str) -> int:
    """The record a conversation sends. The runner numbers conversations `c<n>` (`w<n>` for warmup) across
    workers, so record n % len(records) is sent once per pass, whichever worker sends it."""
    m = _INDEX.search(conversation_id)
    return int(m.group(1)) if m else 0


def _slot(messages: list[dict[str, Any]]) -> tuple[int, int | None, str] | None:
    """(message index, part index or None, text) of the text an ISL is fitted in: the last message's, or
    in an agent conversation ending on a turn without text (an assistant's bare tool calls) the last text
    before it (a tool result, the user's message)."""
    for i in range(len(messages) - 1, -1, -1):
        content = messages[i].get("content")
        if isinstance(content, str):
            return i, None, content
        if isinstance(content, list):
            for j in range(len(content) - 1, -1, -1):
                part = content[j]
                if (
                    isinstance(part, dict)
                    and part.get("type") == "text"
                    and isinstance(part.get("text"), str)
                ):
                    return i, j, part["text"]
    return None


class DatasetWorkload(Workload):
    """Requests from dataset records, cycled in file order."""

    def __init__(
        self,
        tok: Any,
        cfg: LoadgenConfig,
        records: list[DatasetRecord],
        corpus: Corpus | None = None,
        *,
        served: Any = None,
    ) -> None:
        super().__init__(tok, cfg, corpus, served=served)
        self.records = records

    def start(self, conversation_id: str) -> tuple[Conversation, Request]:
        index = record_index(conversation_id) % len(self.records)
        rec = self.records[index]
        conv = Conversation(conversation_id, None, rng=random.Random(f"{self.cfg.seed}/dataset/{index}"))
        built = self._body_builder(rec)
        if built is None:
            return conv, self._failed(conv, 0, rec.isl or 0, "the record's last message has no text slot")
        body_for, text = built
        target = rec.isl or self.cfg.isl or None
        if target is None:
            return conv, self._as_is(conv, body_for(text))
        words = text.split(" ") if text else []
        words += self.corpus.sample(conv.rng, target + SLACK_WORDS)
        return conv, self._finish(conv, target, target, 0, body_for, None, words=words)

    def _body_builder(self, rec: DatasetRecord) -> tuple[Callable[[str], dict[str, Any]], str] | None:
        osl, tools = rec.osl, rec.tools
        if self.cfg.endpoint == "completions":
            if rec.prompt is None:
                return None  # a chat record on completions: refused at load (sources.py)
            return (lambda text: self._body(text, osl)), rec.prompt
        messages = rec.messages or [{"role": "user", "content": rec.prompt or ""}]
        slot = _slot(messages)
        if slot is None:
            return None
        i, j, text = slot

        def body_for(new_text: str) -> dict[str, Any]:
            msgs = copy.deepcopy(messages)
            if j is None:
                msgs[i]["content"] = new_text
            else:
                msgs[i]["content"][j]["text"] = new_text
            body = self._body(msgs, osl)
            if tools is not None:
                body["tools"] = anthropic_tools(tools) if self.cfg.endpoint == "messages" else tools
            return body

        return body_for, text

    def _as_is(self, conv: Conversation, body: dict[str, Any]) -> Request:
        """A record without an ISL: sent as written; its target is its own count."""
        conv.turn += 1
        wire = orjson.dumps(body)
        client, err = self.count(orjson.loads(wire))
        target = client or 0
        return Request(conv.id, conv.turn, body, wire, target, target, client, 0, err, None)
