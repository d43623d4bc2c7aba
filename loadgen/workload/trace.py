"""`--trace FILE`: replay a mooncake trace at exact token counts, with the trace's prefix reuse. Pure but
reading the file.

The format (kvcache-ai/Mooncake FAST25-release/traces; AIPerf's and Dynamo's `mooncake_trace`): one JSON
object per line, `timestamp` (milliseconds since the first request), `input_length`, `output_length` and
`hash_ids`, the ids of the prompt's consecutive blocks of `block_size` tokens (512 in Mooncake's traces):
two requests with the same leading ids share that prefix. vLLM's timed-trace replay and AIPerf build
token-id prompts from them, which a chat template then wraps; here the prompt is text and the whole
templated request is budgeted:

- every hash id is one block of text of exactly `--block-size` tokens (counted alone), drawn from the corpus
  with a seed of the id, so equal ids are equal text and a shared run of ids is a shared text prefix at the
  same token position (the template's head comes first in every request);
- a request's user content is its blocks in order, followed by words unique to the request; the budget
  (loadgen/workload/budget.py) takes the longest run of that sequence whose templated count equals `input_length`,
  so the last block is cut where the count is met (as a partial last block is in the trace) and a request
  whose template costs more than its last block holds loses the tail of the block before;
- it is sent at `timestamp / --trace-speedup` after the start, with `max_tokens = output_length`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.config import LoadgenConfig
from loadgen.workload.arrivals import scaled_trace
from loadgen.workload.budget import fit_text
from loadgen.workload.conversations import SLACK_WORDS, Conversation, Request, Workload
from loadgen.workload.corpus import Corpus
from loadgen.workload.dataset import load_jsonl, record_index
from proxy.core.tokens import encode_len


@dataclass(frozen=True)
class TraceRecord:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _positive(obj: dict[str, Any], key: str, where: str) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{where}: {key} must be a positive integer")
    return value


def parse_line(obj: Any, where: str) -> TraceRecord:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: not a JSON object")
    ts = obj.get("timestamp", 0)
    if not isinstance(ts, int | float) or isinstance(ts, bool) or ts < 0:
        raise ValueError(f"{where}: timestamp must be a number of milliseconds >= 0")
    ids = obj.get("hash_ids", [])
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
        raise ValueError(f"{where}: hash_ids must be a list of integers")
    return TraceRecord(
        float(ts), _positive(obj, "input_length", where), _positive(obj, "output_length", where), tuple(ids)
    )


def load_trace(path: Path) -> list[TraceRecord]:
    """The trace's records in timestamp order (stable: equal timestamps keep the file's order)."""
    return sorted(load_jsonl(path, "--trace", parse_line), key=lambda r: r.timestamp_ms)


def records_within(records: list[TraceRecord], speedup: float, duration: float | None) -> int:
    """How many records (from the first) are sent before `duration` seconds."""
    if duration is None:
        return len(records)
    return sum(1 for t in scaled_trace([r.timestamp_ms for r in records], speedup) if t < duration)


class TraceWorkload(Workload):
    def __init__(
        self,
        tok: Any,
        cfg: LoadgenConfig,
        records: list[TraceRecord],
        corpus: Corpus | None = None,
        *,
        served: Any = None,
    ) -> None:
        super().__init__(tok, cfg, corpus, served=served)
        self.records = records
        self._blocks: dict[int, list[str]] = {}

    def block(self, hash_id: int) -> list[str]:
        """The words of one hash id's block: `block_size` tokens counted alone, the same for every request."""
        words = self._blocks.get(hash_id)
        if words is None:
            size = self.cfg.block_size
            rng = random.Random(f"{self.cfg.seed}/block/{hash_id}")
            candidates = self.corpus.sample(rng, size + SLACK_WORDS)
            fit = fit_text(lambda t: encode_len(self.tok, t, False), size, candidates, self.corpus.fillers)
            words = fit.text.split(" ")
            self._blocks[hash_id] = words
        return words

    def start(self, conversation_id: str) -> tuple[Conversation, Request]:
        index = record_index(conversation_id) % len(self.records)
        rec = self.records[index]
        conv = Conversation(conversation_id, None, rng=random.Random(f"{self.cfg.seed}/trace/{index}"))
        words = [w for h in rec.hash_ids for w in self.block(h)]
        words += self.corpus.sample(conv.rng, max(rec.input_length - len(words), 0) + SLACK_WORDS)
        osl = rec.output_length
        if self.cfg.endpoint == "completions":
            body_for: Any = lambda text: self._body(text, osl)  # noqa: E731
        else:
            body_for = lambda text: self._body([{"role": "user", "content": text}], osl)  # noqa: E731
        target = rec.input_length
        return conv, self._finish(conv, target, target, 0, body_for, None, words=words)

    def offsets(self, worker: int, workers: int) -> list[float] | None:
        n = self.cfg.request_count or len(self.records)
        times = scaled_trace([r.timestamp_ms for r in self.records[:n]], self.cfg.trace_speedup)
        return times[worker:n:workers]
