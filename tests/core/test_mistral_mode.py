"""vLLM's `mistral` tokenizer mode (core/renderers/mistral.py, core/renderers/mistral_request.py) on the real vocabularies that
mistral-common ships: Mistral Nemo's tekken (v3) and Mistral Large 2411's SentencePiece (v7).

The expected ids come from mistral-common itself, on requests built with its own message classes (an
independent construction, not islwatch's code path); the vLLM-specific rules (folder detection, id
truncation, argument re-dump, refusals) are the ones observed with vLLM 0.32's own functions. The
committed check against vLLM itself is tests/vllm_oracle/.
"""

from __future__ import annotations

import json
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import mistral_common
import pytest
from mistral_common.protocol.instruct.chunk import TextChunk
from mistral_common.protocol.instruct.messages import (
    AssistantMessage,
    SystemMessage,
    ToolMessage,
    UserMessage,
)
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.protocol.instruct.tool_calls import Function, FunctionCall, Tool, ToolCall
from mistral_common.protocol.instruct.validator import ValidationMode
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

from proxy.core.messages import REFUSES, InvalidBody, ServerRefuses
from proxy.core.renderers.mistral import (
    MediaNotModelled,
    MistralLoadError,
    MistralRenderer,
    is_mistral_folder,
    load_mistral,
    tokenizer_file,
)

DATA = Path(mistral_common.__file__).parent / "data"
VOCABS = {
    # name: (file in mistral_common/data, name in a model folder)
    "nemo": ("tekken_240718.json", "tekken.json"),
    "large-2411": ("mistral_instruct_tokenizer_241114.model.v7", "tokenizer.model.v7"),
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
WEATHER_TOOL = Tool(function=Function(**WEATHER["function"]))  # type: ignore[arg-type]


def model_folder(root: Path, vocab: str) -> Path:
    """A model folder as vLLM sees one: the vocabulary under its usual name, and (empty) consolidated weights."""
    src, name = VOCABS[vocab]
    folder = root / vocab
    folder.mkdir()
    shutil.copyfile(DATA / src, folder / name)
    (folder / "consolidated.safetensors").touch()
    return folder


@pytest.fixture(scope="module")
def renderers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, MistralRenderer]:
    root = tmp_path_factory.mktemp("models")
    return {vocab: load_mistral(model_folder(root, vocab)) for vocab in VOCABS}


@pytest.fixture(params=sorted(VOCABS))
def renderer(request: pytest.FixtureRequest, renderers: dict[str, MistralRenderer]) -> MistralRenderer:
    return renderers[request.param]


@cache
def own_tokenizer(file: str) -> MistralTokenizer:  # type: ignore[type-arg]
    return MistralTokenizer.from_file(file, mode=ValidationMode.test)


def own_ids(r: MistralRenderer, **request: Any) -> list[int]:
    """mistral-common's own encoding of a request built with its classes, by a tokenizer of its own."""
    return list(own_tokenizer(str(r.file)).encode_chat_completion(ChatCompletionRequest(**request)).tokens)


# --- detection and loading ---------------------------------------------------------------------------------

LAYOUTS = [  # files under the folder -> whether vLLM 0.32's resolve_tokenizer_args picks "mistral"
    (["consolidated.safetensors", "tekken.json"], True),
    (["consolidated.safetensors"], False),
    (["tekken.json"], False),
    (["sub/consolidated.safetensors", "tokenizer.model.v3"], True),  # any depth (rglob)
    (["consolidated-00001-of-00002.safetensors", "tokenizer.model.v7"], True),
    (["CONSOLIDATED.safetensors", "tekken.json"], False),  # case-sensitive
    (["consolidated.safetensors", "mistral_instruct_tokenizer_241114.model.v7"], False),  # name must match
    (["consolidated.safetensors", "tokenizer.model.v1"], True),
    (["consolidated.safetensors", "tokenizer.model"], False),
    (["consolidated.safetensors.index.json", "tekken.json"], False),
    (["consolidated.pth", "tokenizer.model.v3"], False),
    (["consolidated.safetensors", "tokenizer.model.v7m1"], True),
]


@pytest.mark.parametrize(("files", "mistral"), LAYOUTS)
def test_folder_detection_follows_vllm(tmp_path: Path, files: list[str], mistral: bool) -> None:
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).touch()
    assert is_mistral_folder(tmp_path) is mistral
    assert not is_mistral_folder(tmp_path / "absent")


def test_tekken_wins_and_only_the_top_level_is_loaded(tmp_path: Path) -> None:
    both = tmp_path / "both"
    both.mkdir()
    shutil.copyfile(DATA / "tekken_240718.json", both / "tekken.json")
    shutil.copyfile(DATA / "mistral_instruct_tokenizer_241114.model.v7", both / "tokenizer.model.v7")
    assert tokenizer_file(both).name == "tekken.json"
    nested = tmp_path / "nested"
    (nested / "sub").mkdir(parents=True)
    (nested / "consolidated.safetensors").touch()
    shutil.copyfile(DATA / "tekken_240718.json", nested / "sub" / "tekken.json")
    assert is_mistral_folder(nested)  # vLLM picks the mode, then cannot load a tokenizer
    with pytest.raises(MistralLoadError):
        load_mistral(nested)


def test_loaded_vocabularies(renderers: dict[str, MistralRenderer]) -> None:
    nemo, large = renderers["nemo"], renderers["large-2411"]
    assert (nemo.version, large.version) == (3, 7)
    assert (nemo.bos, nemo.eos, large.bos, large.eos) == (1, 2, 1, 2)


# --- counts equal mistral-common's own, for the same request built with its classes ------------------------


def test_single_user_turn(renderer: MistralRenderer) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    expected = own_ids(renderer, messages=[UserMessage(content="What is the capital of France?")])
    assert renderer.chat_ids(body) == expected


def test_system_and_multi_turn(renderer: MistralRenderer) -> None:
    body = {
        "messages": [
            {"role": "system", "content": "Answer in one word."},
            {"role": "developer", "content": "Be polite."},  # mistral-common maps developer to system
            {
                "role": "user",
                "content": [{"type": "text", "text": "Capital of"}, {"type": "text", "text": "Italy?"}],
            },
            {"role": "assistant", "content": "Rome."},
            {"role": "user", "content": "And of Spain? ¿Y 東京?"},
        ]
    }
    expected = own_ids(
        renderer,
        messages=[
            SystemMessage(content="Answer in one word."),
            SystemMessage(content="Be polite."),
            UserMessage(content=[TextChunk(text="Capital of"), TextChunk(text="Italy?")]),
            AssistantMessage(content="Rome."),
            UserMessage(content="And of Spain? ¿Y 東京?"),
        ],
    )
    assert renderer.chat_ids(body) == expected


def test_tools_and_a_tool_round(renderer: MistralRenderer) -> None:
    body = {
        "messages": [
            {"role": "user", "content": "Weather in Paris and Lyon?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "a1b2c3d4e",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    },
                    {
                        "id": "f5g6h7i8j",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "a1b2c3d4e", "content": "22C"},
            {"role": "tool", "tool_call_id": "f5g6h7i8j", "content": [{"type": "text", "text": "19C"}]},
        ],
        "tools": [WEATHER],
        "tool_choice": "auto",
    }
    calls = [
        ToolCall(
            id="a1b2c3d4e", function=FunctionCall(name="get_weather", arguments=json.dumps({"city": "Paris"}))
        ),
        ToolCall(
            id="f5g6h7i8j", function=FunctionCall(name="get_weather", arguments=json.dumps({"city": "Lyon"}))
        ),
    ]
    expected = own_ids(
        renderer,
        messages=[
            UserMessage(content="Weather in Paris and Lyon?"),
            AssistantMessage(tool_calls=calls),
            ToolMessage(tool_call_id="a1b2c3d4e", content="22C"),
            ToolMessage(tool_call_id="f5g6h7i8j", content=[TextChunk(text="19C")]),
        ],
        tools=[WEATHER_TOOL],
    )
    ids = renderer.chat_ids(body)
    assert ids == expected
    # tool_choice "none" keeps the tools in the prompt (vLLM's default); without tools they are gone
    assert renderer.chat_ids({**body, "tool_choice": "none"}) == ids
    no_tools = {k: v for k, v in body.items() if k not in ("tools", "tool_choice")}
    assert len(renderer.chat_ids(no_tools)) < len(ids)


def test_continue_final_message_is_a_prefix(renderer: MistralRenderer) -> None:
    body = {
        "messages": [
            {"role": "user", "content": "Count to three."},
            {"role": "assistant", "content": "One, two,"},
        ],
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
    expected = own_ids(
        renderer,
        messages=[UserMessage(content="Count to three."), AssistantMessage(content="One, two,", prefix=True)],
    )
    assert renderer.chat_ids(body) == expected


def test_request_flags_that_do_not_change_the_ids(renderer: MistralRenderer) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}]}
    ids = renderer.chat_ids(body)
    assert ids[0] == renderer.bos and ids.count(renderer.bos) == 1
    assert renderer.chat_ids({**body, "add_special_tokens": True}) == ids  # ids are not re-encoded
    assert renderer.chat_ids({**body, "reasoning_effort": "high"}) == ids  # passed on from tokenizer v15 only
    assert renderer.chat_ids({**body, "add_generation_prompt": "false"}) == ids  # mistral-common ignores it
    assert renderer.chat_ids({**body, "chat_template": None, "chat_template_kwargs": None}) == ids


# --- vLLM's own edits of the request --------------------------------------------------------------------


def tool_round(call_id: str, result_id: str, arguments: str) -> dict[str, Any]:
    call = {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    return {
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": result_id, "content": "22C"},
        ],
        "tools": [WEATHER],
    }


def test_tool_call_ids_are_cut_to_their_last_nine_characters(renderer: MistralRenderer) -> None:
    long = renderer.chat_ids(tool_round("call_0123456789abcdefXYZ", "call_0123456789abcdefXYZ", "{}"))
    assert long == renderer.chat_ids(tool_round("abcdefXYZ", "abcdefXYZ", "{}"))
    assert long == renderer.chat_ids(tool_round("other_prefix_abcdefXYZ", "zzzabcdefXYZ", "{}"))
    expected = own_ids(
        renderer,
        messages=[
            UserMessage(content="Weather?"),
            AssistantMessage(
                tool_calls=[
                    ToolCall(id="abcdefXYZ", function=FunctionCall(name="get_weather", arguments="{}"))
                ]
            ),
            ToolMessage(tool_call_id="abcdefXYZ", content="22C"),
        ],
        tools=[WEATHER_TOOL],
    )
    assert long == expected


def test_arguments_are_parsed_then_dumped_again(renderer: MistralRenderer) -> None:
    """parse_chat_messages parses each call's arguments in place; mistral-common json.dumps the object."""
    spaced = renderer.chat_ids(tool_round("abcdefXYZ", "abcdefXYZ", '{"city": "Par\\u00eds"}'))
    assert renderer.chat_ids(tool_round("abcdefXYZ", "abcdefXYZ", '{"city":"París"}')) == spaced
    empty = renderer.chat_ids(tool_round("abcdefXYZ", "abcdefXYZ", "{}"))
    for coerced in ("", "{not json", "[1, 2]", "42"):
        assert renderer.chat_ids(tool_round("abcdefXYZ", "abcdefXYZ", coerced)) == empty


# --- refusals (vLLM answers 400) ---------------------------------------------------------------------------

USER = {"role": "user", "content": "SECRET-CLIENT-TEXT"}
ANSWER = {"role": "assistant", "content": "SECRET-CLIENT-TEXT"}
REFUSED = {
    "not an object": ["SECRET-CLIENT-TEXT"],
    "no messages": {"messages": []},
    "chat_template_kwargs, even empty": {"messages": [USER], "chat_template_kwargs": {}},
    "chat_template": {"messages": [USER], "chat_template": "SECRET-CLIENT-TEXT"},
    "reasoning_effort outside the Literal": {"messages": [USER], "reasoning_effort": "SECRET-CLIENT-TEXT"},
    "final assistant, generation prompt by default": {"messages": [USER, ANSWER]},
    "final assistant, no generation prompt, not continued": {
        "messages": [USER, ANSWER],
        "add_generation_prompt": False,
    },
    "continue_final_message with the default generation prompt": {
        "messages": [USER, ANSWER],
        "continue_final_message": True,
    },
    "continue_final_message on a user message": {
        "messages": [USER],
        "continue_final_message": True,
        "add_generation_prompt": False,
    },
    "add_generation_prompt null": {"messages": [USER], "add_generation_prompt": None},
    "unknown role": {"messages": [{"role": "SECRET-CLIENT-TEXT", "content": "x"}]},
    "function role": {"messages": [USER, {"role": "function", "name": "f", "content": "x"}]},
    "user content null": {"messages": [{"role": "user", "content": None}]},
    "user content missing": {"messages": [{"role": "user"}]},
    "name null": {"messages": [{**USER, "name": None}]},
    "unknown part type": {"messages": [{"role": "user", "content": [{"type": "SECRET-CLIENT-TEXT"}]}]},
    "refusal part": {"messages": [{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}]},
    "part without type": {"messages": [{"role": "user", "content": [{"text": "SECRET-CLIENT-TEXT"}]}]},
    "string part": {"messages": [{"role": "user", "content": ["SECRET-CLIENT-TEXT"]}]},
    "reasoning in history": {"messages": [USER, {**ANSWER, "reasoning": "SECRET-CLIENT-TEXT"}, USER]},
    "reasoning_content in history": {"messages": [USER, {**ANSWER, "reasoning_content": "x"}, USER]},
    "system after an answer": {"messages": [USER, ANSWER, {"role": "system", "content": "x"}, USER]},
    "empty assistant message": {"messages": [USER, {"role": "assistant", "content": ""}, USER]},
    "tools empty": {"messages": [USER], "tools": []},
    "tool_choice without tools": {"messages": [USER], "tool_choice": "auto"},
    "tool_choice names no tool": {
        "messages": [USER],
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "SECRET-CLIENT-TEXT"}},
    },
    "tool name mistral-common refuses": {
        "messages": [USER],
        "tools": [{"type": "function", "function": {"name": "SECRET CLIENT"}}],
    },
    "tool parameters not an object": {
        "messages": [USER],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}],
    },
    "tool call arguments an object": {
        "messages": [
            USER,
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "abcdefghi", "type": "function", "function": {"name": "f", "arguments": {}}}
                ],
            },
        ],
    },
    "tool call without id": {
        "messages": [
            USER,
            {
                "role": "assistant",
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
        ],
    },
    "tool result id null": {"messages": [USER, {"role": "tool", "tool_call_id": None, "content": "x"}]},
    "tool result id shorter than nine": {
        **tool_round("abc", "abc", "{}"),
    },
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refusals(renderer: MistralRenderer, case: str) -> None:
    with pytest.raises(ServerRefuses) as info:
        renderer.chat_ids(REFUSED[case])
    assert str(info.value).startswith(REFUSES)
    assert "SECRET" not in str(info.value)  # reasons never quote the request


def test_a_tool_without_function_before_the_named_one_is_a_500(renderer: MistralRenderer) -> None:
    """check_tool_usage indexes the raw tools before the model validates them: a KeyError, not a 400."""
    choice = {"type": "function", "function": {"name": "get_weather"}}
    body = {"messages": [USER], "tools": [{"type": "function"}, WEATHER], "tool_choice": choice}
    with pytest.raises(InvalidBody) as info:
        renderer.chat_ids(body)
    assert not isinstance(info.value, ServerRefuses) and str(info.value).startswith("vllm answers 500: ")
    with pytest.raises(ServerRefuses):  # after the named tool, the model's own validation: a 400
        renderer.chat_ids({**body, "tools": [WEATHER, {"type": "function"}]})


def test_refusals_that_depend_on_the_tokenizer_version(renderers: dict[str, MistralRenderer]) -> None:
    """An assistant message with both text and tool calls: v3 (Nemo) refuses it, v7 (Large 2411) takes it."""
    body = tool_round("abcdefXYZ", "abcdefXYZ", "{}")
    body["messages"][1]["content"] = "Let me look."
    with pytest.raises(InvalidBody):
        renderers["nemo"].chat_ids(body)
    assert renderers["large-2411"].chat_ids(body)


def test_media_is_not_modelled_unless_refused_anyway(renderer: MistralRenderer) -> None:
    image = {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/cat.png"}}
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is it?"}, image]}]}
    with pytest.raises(MediaNotModelled):
        renderer.chat_ids(body)
    with pytest.raises(InvalidBody):  # vLLM refuses the request before any media is looked at
        renderer.chat_ids({**body, "chat_template_kwargs": {}})
    with pytest.raises(InvalidBody):  # "image" is not a part type vLLM's parser knows
        renderer.chat_ids({"messages": [{"role": "user", "content": [{"type": "image", "url": "x"}]}]})


# --- text prompts and the bare count --------------------------------------------------------------------


def test_text_prompt_and_bare_count(renderer: MistralRenderer) -> None:
    raw = renderer.tokenizer.instruct_tokenizer.tokenizer
    text = " Bonjour, 世界! [INST] </s>"
    alone = raw.encode(text, bos=False, eos=False)
    assert renderer.encode(text, add_special_tokens=True) == [renderer.bos, *alone]
    assert renderer.encode(text, add_special_tokens=False) == alone
    assert renderer.text_len([text, "", "hi"]) == len(alone) + len(raw.encode("hi", bos=False, eos=False))


def test_body_is_not_modified(renderer: MistralRenderer) -> None:
    body = tool_round("call_0123456789abcdef", "call_0123456789abcdef", '{"city":"Paris"}')
    body["messages"][1]["reasoning_content"] = None
    before = json.dumps(body, sort_keys=True)
    renderer.chat_ids(body)
    assert json.dumps(body, sort_keys=True) == before
