"""Shared bench helpers: the machine description, percentiles, chat workloads, JSON results."""

from __future__ import annotations

import json
import os
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

import tokenizers
import transformers

from loadgen.workload.corpus import WORDS

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results"
# The real tokenizer folders the tests use, built by scripts/build_test_data.py (scripts/test.sh exports the path).
CACHE = Path(os.environ.get("ISLWATCH_CACHE", Path.home() / ".cache" / "islwatch"))
TEST_TOKENIZERS = Path(os.environ.get("ISLWATCH_TEST_DATA", CACHE / "test-data")) / "tokenizers"
FAMILIES = (
    "mistral-7b-instruct-v0.1",
    "qwen2.5-instruct",
    "llama-3-8b-instruct",
    "phi-3-mini-4k-instruct",
    "tinyllama-1.1b-chat-v1.0",
    "smollm2-135m-instruct",
    "deepseek-v3",
    "qwen3",
    "llama-3.1",
    "gemma-3",
    "gpt-oss",
    "deepseek-r1",
)
PUNCT = (".", ",", "?", "!", ";", ":")


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        mem_gb = None
    return {
        "cpu": model or platform.processor(),
        "cores": os.cpu_count(),
        "memory_gb": mem_gb,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "load_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def prose(rng: random.Random, words: int) -> str:
    """Sentence-like English: common words, capitals, punctuation, a few numbers and line breaks."""
    out: list[str] = []
    sentence = 0
    for _ in range(words):
        w = rng.choice(WORDS)
        if sentence == 0:
            w = w.capitalize()
        if rng.random() < 0.03:
            w = str(rng.randint(2, 2025))
        sentence += 1
        if sentence > rng.randint(6, 18):
            w += rng.choice(PUNCT)
            sentence = 0
        out.append(w)
        if sentence == 0 and rng.random() < 0.1:
            out.append("\n")
    return " ".join(out).replace(" \n ", "\n")


def conversation(rng: random.Random, turns: int, words_per_message: int) -> list[dict[str, str]]:
    """`turns` user messages with assistant replies in between (2*turns-1 messages)."""
    msgs: list[dict[str, str]] = []
    for i in range(turns):
        if i:
            msgs.append({"role": "assistant", "content": prose(rng, words_per_message)})
        msgs.append({"role": "user", "content": prose(rng, words_per_message)})
    return msgs


def words_for_tokens(tok: Any, target_tokens: int, turns: int) -> int:
    """Words per message so the whole `turns`-turn conversation renders to about `target_tokens` tokens."""
    probe = conversation(random.Random(1), turns, 100)
    rendered = tok.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
    n = len(tok(rendered, add_special_tokens=False)["input_ids"])
    return max(1, round(100 * target_tokens / n))


def write_result(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    path = RESULTS / f"{name}-{stamp}.json"
    text = json.dumps(data, indent=2, sort_keys=True, default=str)
    path.write_text(text)
    (RESULTS / f"{name}-latest.json").write_text(text)
    return path


def encode_body(body: dict[str, Any], stream: bool) -> bytes:
    """The exact bytes the load client sends (the replay upstream looks responses up by these bytes)."""
    import orjson

    extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {"stream": False}
    return orjson.dumps({**body, **extra})
