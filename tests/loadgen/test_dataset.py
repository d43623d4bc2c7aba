"""`--dataset`: JSONL records sent at their exact ISL (or as written), checked on the wire against the
emulator (vLLM's counting path) and against a real llama-server's usage."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from loadgen.config import LoadgenConfig
from loadgen.send.runner import Engine, Record
from loadgen.workload.dataset import DatasetWorkload, load_dataset
from loadgen.workload.sources import build_workload
from proxy.emulator.app import EmulatorConfig, start_emulator
from tests.builders import build_tokenizer
from tests.conftest import load_builtin
from tests.loadgen.real_servers import qwen_llama_server

LONG = " ".join(f"word{i % 7} of a long record number {i}." for i in range(60))  # ~500 tokens
RECORDS = [
    {"messages": [{"role": "user", "content": "Tell me about the sea."}], "isl": 300, "osl": 3},
    {"messages": [{"role": "user", "content": LONG}], "isl": 60},
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                  {"role": "user", "content": [{"type": "text", "text": "And then what happened next?"}]}],
     "isl": 150},
    {"prompt": "Write a haiku about tokens.", "osl": 2},
    {"messages": [{"role": "user", "content": "A record sent exactly as written."}], "ignored": True},
]  # fmt: skip


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def config(url: str, dataset: Path, **kw: Any) -> LoadgenConfig:
    return LoadgenConfig(**{"url": url, "dataset": dataset, "concurrency": 2, "osl": 4, **kw})


async def run(tok: Any, cfg: LoadgenConfig) -> list[Record]:
    cfg, workload = build_workload(tok, cfg)
    return sorted(await Engine(cfg, workload).run(), key=lambda r: int(r.conversation[1:]))


@pytest.fixture
async def emulator() -> AsyncIterator[str]:
    runner, url = await start_emulator(EmulatorConfig(), tokenizer=load_builtin())
    yield url
    await runner.cleanup()


def test_bad_lines_are_named_by_number_not_by_content(tmp_path: Path) -> None:
    secret = "do-not-log-this-prompt"
    for row, message in (
        (b'{"messages": "' + secret.encode() + b'"}', "line 2: messages must be a non-empty list"),
        (b'{"prompt": "' + secret.encode() + b'", "messages": []}', "line 2: give exactly one of"),
        (b'{"prompt": "' + secret.encode() + b'", "isl": 0}', "line 2: isl must be a positive integer"),
        (secret.encode(), "line 2: not JSON"),
    ):
        path = tmp_path / "d.jsonl"
        path.write_bytes(b'{"prompt": "fine"}\n' + row + b"\n")
        with pytest.raises(ValueError, match=message) as err:
            load_dataset(path)
        assert secret not in str(err.value)


def test_fitted_text_keeps_the_records_words_cut_or_extended(tmp_path: Path) -> None:
    tok = load_builtin().tokenizer
    cfg = config("http://x", write_jsonl(tmp_path / "d.jsonl", RECORDS))
    workload = DatasetWorkload(tok, cfg, load_dataset(cfg.dataset))  # type: ignore[arg-type]
    padded = workload.start("c0")[1].body["messages"][-1]["content"]
    assert padded.startswith("Tell me about the sea. ") and len(padded) > 200
    cut = workload.start("c1")[1].body["messages"][-1]["content"]
    assert LONG.startswith(cut) and len(cut) < len(LONG) / 2
    parts = workload.start("c2")[1].body["messages"]
    assert parts[:2] == RECORDS[2]["messages"][:2]  # type: ignore[index]
    assert parts[2]["content"][0]["text"].startswith("And then what happened next? ")
    as_is = workload.start("c4")[1]
    assert as_is.body["messages"] == RECORDS[4]["messages"] and "ignored" not in as_is.body


async def test_every_record_is_exact_against_the_emulator(emulator: str, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", RECORDS)
    recs = await run(load_builtin().tokenizer, config(emulator, path))
    assert len(recs) == len(RECORDS)  # one pass over the file
    for r, row in zip(recs, RECORDS, strict=True):
        assert r.error is None and r.budget_error is None, r
        assert r.client_isl == r.target_isl == r.server_prompt_tokens, r
        if "isl" in row:
            assert r.target_isl == row["isl"]
        assert r.output_tokens == row.get("osl", 4)


async def test_isl_flag_is_the_default_and_records_cycle(emulator: str, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", RECORDS)
    recs = await run(
        load_builtin().tokenizer, config(emulator, path, isl=90, request_count=7, streaming=True)
    )
    assert [r.target_isl for r in recs] == [300, 60, 150, 90, 90, 300, 60]
    assert all(r.client_isl == r.target_isl == r.server_prompt_tokens for r in recs), recs


async def test_completions_and_a_system_message_template(tmp_path: Path) -> None:
    tok = build_tokenizer("chatml")
    runner, url = await start_emulator(EmulatorConfig(), tokenizer=tok)
    try:
        sys_rows = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}],
                     "isl": 80}]  # fmt: skip
        chat = await run(tok, config(url, write_jsonl(tmp_path / "s.jsonl", sys_rows)))
        prompts = [{"prompt": "The quick brown fox", "isl": 40}, {"prompt": "Paris is the capital"}]
        completions = await run(
            tok, config(url, write_jsonl(tmp_path / "p.jsonl", prompts), endpoint="completions")
        )
    finally:
        await runner.cleanup()
    for r in chat + completions:
        assert r.budget_error is None and r.client_isl == r.target_isl == r.server_prompt_tokens, r
    assert [r.target_isl for r in chat] == [80] and completions[0].target_isl == 40


def test_messages_records_are_refused_on_completions(tmp_path: Path) -> None:
    cfg = config("http://x", write_jsonl(tmp_path / "d.jsonl", RECORDS), endpoint="completions")
    with pytest.raises(ValueError, match="messages records need --endpoint chat or responses"):
        build_workload(load_builtin().tokenizer, cfg)


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    with qwen_llama_server(tmp_path_factory.mktemp("llama-dataset")) as server:
        yield server


@pytest.mark.llama_server
async def test_every_record_is_exact_against_llama_server(
    llama_server: tuple[str, Any], tmp_path: Path
) -> None:
    url, tok = llama_server
    path = write_jsonl(tmp_path / "d.jsonl", RECORDS)
    recs = await run(tok, config(url, path, concurrency=1, streaming=True))
    assert len(recs) == len(RECORDS)
    for r in recs:
        assert r.error is None and r.budget_error is None, r
        assert r.client_isl == r.target_isl == r.server_prompt_tokens, r
