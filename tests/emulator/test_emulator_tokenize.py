"""`POST /tokenize` of the emulator answers like vLLM 0.32's: the tokenizer's own ids for prompts and for
rendered chats, vLLM's defaults, 400 on bodies vLLM refuses; the `tokenizer=SPEC` fault swaps the encoder
of both /tokenize and prompt counting while the chat template stays the main tokenizer's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.core.tokenizer import load_tokenizer
from proxy.core.tokens import template_ids
from proxy.emulator.faults import Faults, parse_faults
from tests.builders import build_tokenizer, save_tokenizer
from tests.conftest import load_builtin
from tests.emulator.emulator_helpers import CHAT, FRANCE, SYSTEM, THREE, emulator, post, stats

TOKENIZE = "/tokenize"
TEXTS = ["Return the word READY.", " leading  spaces\n\nand\ttabs", "café 東京 🙂", ""]


@pytest.fixture(scope="module")
def other_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tokenizer unlike the built-in one (a small trained BPE with a ChatML template)."""
    return save_tokenizer("chatml", str(tmp_path_factory.mktemp("other") / "tok"))


def own_ids(tok: Any, text: str, special: bool) -> list[int]:
    return list(tok(text, add_special_tokens=special)["input_ids"])


@pytest.mark.parametrize("style", ["builtin", "chatml", "llama3"])
@pytest.mark.parametrize("text", TEXTS)
async def test_prompt_ids_are_the_tokenizers_own(aiohttp_client: Any, style: str, text: str) -> None:
    tok = load_builtin().tokenizer if style == "builtin" else build_tokenizer(style)
    client = await emulator(aiohttp_client, tok)
    status, default = await post(client, TOKENIZE, {"model": "m", "prompt": text})
    assert status == 200
    assert default == {
        "count": len(own_ids(tok, text, True)),
        "max_model_len": 4096,
        "tokens": own_ids(tok, text, True),  # vLLM's TokenizeCompletionRequest: special tokens by default
        "token_strs": None,
    }
    _, plain = await post(client, TOKENIZE, {"prompt": text, "add_special_tokens": False})
    assert plain["tokens"] == own_ids(tok, text, False) and plain["count"] == len(plain["tokens"])


@pytest.mark.parametrize("messages", [FRANCE, THREE], ids=["one", "three"])
@pytest.mark.parametrize("style", ["builtin", "chatml", "llama3"])
async def test_chat_ids_are_the_templates_own(aiohttp_client: Any, style: str, messages: Any) -> None:
    tok = load_builtin().tokenizer if style == "builtin" else build_tokenizer(style)
    client = await emulator(aiohttp_client, tok)
    status, answer = await post(client, TOKENIZE, {"model": "m", "messages": messages})
    assert status == 200
    assert answer["tokens"] == template_ids(tok, messages, True, False)  # add_generation_prompt default true
    assert answer["count"] == len(answer["tokens"]) and answer["token_strs"] is None
    _, usage = await post(client, CHAT, {"messages": messages})
    assert usage["usage"]["prompt_tokens"] == answer["count"]  # the same count as inference


async def test_chat_flags_follow_the_request(aiohttp_client: Any) -> None:
    tok = build_tokenizer("chatml")
    client = await emulator(aiohttp_client, tok)
    _, off = await post(client, TOKENIZE, {"messages": FRANCE, "add_generation_prompt": False})
    assert off["tokens"] == template_ids(tok, FRANCE, False, False)
    last = [*FRANCE, {"role": "assistant", "content": "Paris"}]
    body = {"messages": last, "add_generation_prompt": False, "continue_final_message": True}
    _, cont = await post(client, TOKENIZE, body)
    assert cont["tokens"] == template_ids(tok, last, False, True)


async def test_token_strs_and_max_model_len(aiohttp_client: Any) -> None:
    tok = load_builtin().tokenizer
    client = await emulator(aiohttp_client, tok, max_model_len=32768)
    _, answer = await post(client, TOKENIZE, {"prompt": "hello world", "return_token_strs": True})
    assert answer["max_model_len"] == 32768
    assert answer["token_strs"] == tok.convert_ids_to_tokens(own_ids(tok, "hello world", True))


BAD_BODIES = [
    ("null", b"null"),
    ("not json", b"{"),
    ("a list", b"[]"),
    ("neither field", b'{"model": "m"}'),
    ("prompt not text", b'{"prompt": [1, 2]}'),
    ("flag not bool", b'{"prompt": "x", "add_special_tokens": "yes"}'),
    ("empty messages", b'{"messages": []}'),
    ("messages not list", b'{"messages": "hi"}'),
    ("chat flag not bool", b'{"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": 1}'),
    (
        "both generation flags",
        b'{"messages": [{"role": "user", "content": "x"}], "continue_final_message": true}',
    ),
    ("template refuses", orjson.dumps({"messages": SYSTEM})),  # Mistral v0.1 has no system role
]


@pytest.mark.parametrize("raw", [b for _, b in BAD_BODIES], ids=[n for n, _ in BAD_BODIES])
async def test_bad_bodies_are_400_in_vllms_error_shape(aiohttp_client: Any, raw: bytes) -> None:
    client = await emulator(aiohttp_client, load_builtin().tokenizer)
    resp = await client.post(TOKENIZE, data=raw, headers={"Content-Type": "application/json"})
    assert resp.status == 400
    error = orjson.loads(await resp.read())["error"]
    assert error["code"] == 400 and error["type"] == "BadRequestError" and error["message"]


async def test_unserved_model_is_404_in_strict_mode(aiohttp_client: Any) -> None:
    client = await emulator(aiohttp_client, load_builtin().tokenizer, models=("a",), strict_models=True)
    assert (await post(client, TOKENIZE, {"model": "b", "prompt": "x"}))[0] == 404
    assert (await post(client, TOKENIZE, {"model": "a", "prompt": "x"}))[0] == 200


async def test_status_fault_leaves_tokenize_alone(aiohttp_client: Any) -> None:
    client = await emulator(aiohttp_client, load_builtin().tokenizer, "status=503")
    assert (await post(client, TOKENIZE, {"prompt": "x"}))[0] == 200
    assert (await post(client, CHAT, {"messages": FRANCE}))[0] == 503


def test_tokenizer_fault_spec_keeps_the_whole_spec() -> None:
    assert parse_faults(["tokenizer=org/name@abc123"]) == Faults(tokenizer="org/name@abc123")
    faults = parse_faults(["tokenizer=builtin:mistral-v0.1", "system-prompt=3"])
    assert "tokenizer=builtin:mistral-v0.1" in faults.describe() and faults.changes_count
    assert parse_faults(faults.describe()) == faults
    for bad in ("tokenizer", "tokenizer=", "tokenizer@0.5"):
        with pytest.raises(ValueError, match="tokenizer=SPEC"):
            parse_faults([bad])


async def test_tokenizer_fault_swaps_the_encoder(aiohttp_client: Any, other_folder: str) -> None:
    tok = load_builtin().tokenizer
    other = load_tokenizer(other_folder).tokenizer
    client = await emulator(aiohttp_client, tok, f"tokenizer={other_folder}")
    text = "Return the word READY."
    _, prompt = await post(client, TOKENIZE, {"prompt": text, "add_special_tokens": False})
    assert prompt["tokens"] == own_ids(other, text, False) != own_ids(tok, text, False)
    # The chat: the main tokenizer's template, the other tokenizer's encoder (add_special_tokens false).
    rendered = tok.apply_chat_template(FRANCE, tokenize=False, add_generation_prompt=True)
    _, chat = await post(client, TOKENIZE, {"messages": FRANCE})
    assert chat["tokens"] == own_ids(other, rendered, False)
    _, answer = await post(client, CHAT, {"messages": FRANCE})
    assert answer["usage"]["prompt_tokens"] == chat["count"] != len(template_ids(tok, FRANCE, True, False))
    _, completion = await post(client, "/v1/completions", {"prompt": text, "max_tokens": 1})
    assert completion["usage"]["prompt_tokens"] == len(own_ids(other, text, True))
    assert f"tokenizer={other_folder}" in (await stats(client))["faults"]


def test_tokenizer_fault_that_cannot_load_fails_the_app(tmp_path: Path) -> None:
    from proxy.core.tokenizer import TokenizerLoadError
    from proxy.emulator.app import EmulatorConfig, build_emulator_app

    config = EmulatorConfig(faults=parse_faults([f"tokenizer={tmp_path / 'missing'}"]))
    with pytest.raises(TokenizerLoadError):
        build_emulator_app(config, tokenizer=load_builtin())
