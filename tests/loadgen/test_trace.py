"""`--trace`: a mooncake trace replayed at its timestamps, every request at its exact input_length, and the
trace's prefix reuse visible where the server reports cached tokens (llama-server's
`prompt_tokens_details.cached_tokens`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from loadgen.config import LoadgenConfig
from loadgen.send.runner import Engine, Record
from loadgen.workload.sources import build_workload
from loadgen.workload.trace import TraceWorkload, load_trace
from proxy.core.tokens import encode_len
from proxy.emulator.app import EmulatorConfig, start_emulator
from tests.conftest import load_builtin
from tests.loadgen.real_servers import qwen_llama_server

BLOCK = 64
# Shaped like Mooncake's traces (FAST25-release/traces): the same leading ids mean the same prompt prefix.
TRACE = [
    {"timestamp": 0, "input_length": 200, "output_length": 3, "hash_ids": [1, 2, 3]},
    {"timestamp": 400, "input_length": 210, "output_length": 2, "hash_ids": [1, 2, 4]},
    {"timestamp": 800, "input_length": 120, "output_length": 4, "hash_ids": [1, 5]},
    {"timestamp": 1200, "input_length": 110, "output_length": 3, "hash_ids": [6, 9]},
    {"timestamp": 1600, "input_length": 190, "output_length": 2, "hash_ids": [6, 7, 8]},
]
SHARED_BLOCKS = [0, 2, 1, 0, 1]  # leading blocks each request shares with an earlier one (its best match)


def write_trace(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def config(url: str, trace: Path, **kw: Any) -> LoadgenConfig:
    return LoadgenConfig(**{"url": url, "trace": trace, "block_size": BLOCK, "trace_speedup": 20.0, **kw})


async def run(tok: Any, cfg: LoadgenConfig) -> list[Record]:
    cfg, workload = build_workload(tok, cfg)
    return sorted(await Engine(cfg, workload).run(), key=lambda r: int(r.conversation[1:]))


def test_lines_are_read_in_timestamp_order_and_checked(tmp_path: Path) -> None:
    rows = [{"timestamp": 50, "input_length": 10, "output_length": 1, "hash_ids": [2]},
            {"timestamp": 10, "input_length": 20, "output_length": 2}]  # fmt: skip
    records = load_trace(write_trace(tmp_path / "t.jsonl", rows))
    assert [(r.timestamp_ms, r.input_length, r.hash_ids) for r in records] == [(10, 20, ()), (50, 10, (2,))]
    bad = write_trace(tmp_path / "b.jsonl", [*rows, {"timestamp": 1, "input_length": 0, "output_length": 1}])
    with pytest.raises(ValueError, match="line 3: input_length must be a positive integer"):
        load_trace(bad)


def test_shared_hash_ids_are_the_same_text_at_the_same_place(tmp_path: Path) -> None:
    tok = load_builtin().tokenizer
    cfg = config("http://x", write_trace(tmp_path / "t.jsonl", TRACE))
    workload = TraceWorkload(tok, cfg, load_trace(cfg.trace))  # type: ignore[arg-type]
    texts = [workload.start(f"c{i}")[1].body["messages"][0]["content"] for i in range(len(TRACE))]
    for h in (1, 2, 6):
        assert encode_len(tok, " ".join(workload.block(h)), False) == BLOCK
    one, two = " ".join(workload.block(1)), " ".join(workload.block(2))
    assert texts[0].startswith(f"{one} {two} ") and texts[1].startswith(f"{one} {two} ")
    assert texts[2].startswith(f"{one} ") and not texts[2].startswith(f"{one} {two}")
    assert not texts[3].startswith(" ".join(workload.block(1)[:3]))
    assert texts[4].startswith(" ".join(workload.block(6)) + " ")
    # The first request's third block is cut where its count is met: a prefix of block 3's own text.
    three = texts[0][len(one) + len(two) + 2 :]
    assert " ".join(workload.block(3)).startswith(three) and three


def test_each_worker_sends_its_share_of_the_schedule(tmp_path: Path) -> None:
    cfg = config("http://x", write_trace(tmp_path / "t.jsonl", TRACE), workers=2)
    cfg, workload = build_workload(load_builtin().tokenizer, cfg)
    assert workload.offsets(0, 2) == pytest.approx([0.0, 0.04, 0.08])
    assert workload.offsets(1, 2) == pytest.approx([0.02, 0.06])


@pytest.fixture
async def emulator() -> AsyncIterator[str]:
    runner, url = await start_emulator(EmulatorConfig(), tokenizer=load_builtin())
    yield url
    await runner.cleanup()


async def test_replay_is_exact_and_on_the_traces_clock(emulator: str, tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.jsonl", TRACE)
    recs = await run(load_builtin().tokenizer, config(emulator, path, streaming=True))
    assert len(recs) == len(TRACE)
    for r, row in zip(recs, TRACE, strict=True):
        assert r.error is None and r.budget_error is None, r
        assert r.client_isl == r.target_isl == r.server_prompt_tokens == row["input_length"], r
        assert r.output_tokens == row["output_length"]
    starts = [r.scheduled_at for r in recs if r.scheduled_at is not None]
    assert [s - starts[0] for s in starts] == pytest.approx([row["timestamp"] / 1000 / 20 for row in TRACE])


async def test_request_count_and_duration_take_the_first_records(emulator: str, tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.jsonl", TRACE)
    tok = load_builtin().tokenizer
    assert [r.target_isl for r in await run(tok, config(emulator, path, request_count=2))] == [200, 210]
    within = await run(tok, config(emulator, path, duration=0.05))  # timestamps 0, 20 and 40 ms at 20x
    assert [r.target_isl for r in within] == [200, 210, 120]


@pytest.mark.parametrize(
    ("kw", "message"),
    [({"concurrency": 2}, "sends at the trace's timestamps"), ({"isl": 10}, "--isl does not apply to --trace"),
     ({"turns": 2}, "--turns does not apply to --trace"), ({"warmup": 2}, "--warmup does not apply")],
)  # fmt: skip
def test_refused_with_a_trace(tmp_path: Path, kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config("http://x", tmp_path / "t.jsonl", **kw)


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    with qwen_llama_server(tmp_path_factory.mktemp("llama-trace")) as server:
        yield server


@pytest.mark.llama_server
async def test_llama_server_counts_every_request_and_caches_the_shared_blocks(
    llama_server: tuple[str, Any], tmp_path: Path
) -> None:
    url, tok = llama_server
    path = write_trace(tmp_path / "t.jsonl", TRACE)
    recs = await run(tok, config(url, path, trace_speedup=4.0))
    for r, row in zip(recs, TRACE, strict=True):
        assert r.error is None and r.budget_error is None, r
        assert r.client_isl == r.server_prompt_tokens == row["input_length"], r
    cached = [r.cached_prompt_tokens for r in recs]
    assert all(c is not None for c in cached), cached
    # The head every request shares (system prompt and user header of the template), measured on the request
    # that shares no block; each other request reuses that head plus its shared blocks (one token either way
    # where the first word after the shared run happens to match).
    head = cached[3]
    assert head is not None and 0 < head < BLOCK
    for c, shared in zip(cached, SHARED_BLOCKS, strict=True):
        if shared:
            assert c is not None and head + shared * BLOCK - 1 <= c <= head + shared * BLOCK + 2, (
                cached,
                head,
            )


PROSE = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
    "it was the season of Darkness, it was the spring of hope, it was the winter of despair."
)


async def test_a_corpus_file_fills_the_blocks_with_its_running_text(emulator: str, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(PROSE)
    path = write_trace(tmp_path / "t.jsonl", TRACE)
    tok = load_builtin().tokenizer
    cfg, workload = build_workload(tok, config(emulator, path, corpus=corpus))
    assert isinstance(workload, TraceWorkload)
    block = " ".join(workload.block(1))
    assert encode_len(tok, block, False) == BLOCK
    # Runs of the file's words in their order (wrapping around), not a shuffle of a word list.
    words = PROSE.split()
    doubled = " ".join(words + words + words)
    assert " ".join(workload.block(1)[:12]) in doubled
    recs = sorted(await Engine(cfg, workload).run(), key=lambda r: int(r.conversation[1:]))
    assert [r.server_prompt_tokens for r in recs] == [row["input_length"] for row in TRACE]
