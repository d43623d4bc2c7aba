"""gpt-oss prompts as vLLM 0.32 renders them with Harmony (proxy/core/renderers/harmony.py), on gpt-oss's real tokenizer.

The expected ids are vLLM's own: each body below went through vLLM 0.32's `OnlineRenderer.render_chat` /
`render_responses` (the Harmony branch, with VLLM_SYSTEM_START_DATE=2026-01-15) in its own venv, and the
count and a hash of the ids were written down here. The live comparison against vLLM runs in
tests/vllm_oracle. The last tests show where the Hugging Face Jinja template of gpt-oss, which islwatch
counted with before, disagrees with what vLLM sends.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from proxy.core.count import count_request
from proxy.core.messages import REFUSES, InvalidBody, ServerRefuses
from proxy.core.renderers.harmony import (
    HarmonyRenderer,
    HarmonyServer,
    check_library,
    load_harmony,
    server_date,
)
from proxy.core.renderers.harmony_vocab import VOCAB_FILE, VOCAB_SHA256, tiktoken_vocab
from proxy.core.tokenizer import TokenizerLoadError, load_tokenizer
from tests.conftest import REPO, shared_dir

DATE = "2026-01-15"
SECRET = "zq-client-secret-7"  # client text that must never reach a refusal's reason


@pytest.fixture(scope="module")
def gpt_oss() -> Path:
    return shared_dir("gpt-oss")


@pytest.fixture(scope="module")
def harmony(gpt_oss: Path) -> HarmonyRenderer:
    return load_harmony(gpt_oss)


def digest(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {
            "type": "object",
            "properties": {
                "q": {"type": "string"},
                "n": {"type": "integer", "default": 5},
                "tags": {"type": "array", "items": {"type": "string"}},
                "opts": {"type": "object", "properties": {"safe": {"type": "boolean"}}},
            },
            "required": ["q"],
        },
    },
}
NOW = {"type": "function", "function": {"name": "now"}}
FLAT_WEATHER = {  # the Responses API's flat tool
    "type": "function",
    "name": "get_weather",
    "description": "Get weather",
    "parameters": WEATHER["function"]["parameters"],
}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str | None, **kw: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **kw}


def call(i: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def result(i: int, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": f"call_{i}", "content": text}


def paris(**kw: Any) -> dict[str, Any]:
    """An assistant turn that calls get_weather for Paris."""
    return assistant(None, tool_calls=[call(1, "get_weather", {"city": "Paris"})], **kw)


CHAT = {
    "plain": ({"messages": [user("Hello there")]}, 69, "4b263a759560aaa3"),
    "system_dot": (
        {"messages": [{"role": "system", "content": "You are helpful."}, user("Hi")]},
        79,
        "2190e8660232cd4b",
    ),
    "system_nodot": (
        {"messages": [{"role": "system", "content": "You are helpful"}, user("Hi")]},
        78,
        "5eaa495eff880152",
    ),
    "tools": (
        {"messages": [user("Weather in Paris?")], "tools": [WEATHER, SEARCH, NOW]},
        187,
        "91c85d37ac81682f",
    ),
    "call_reasoning": (
        {
            "messages": [user("Weather?"), paris(reasoning="Need to call the tool."), result(1, "18C sunny")],
            "tools": [WEATHER],
        },
        182,
        "24ba77ba299c05ba",
    ),
    "call_with_text": (
        {
            "messages": [
                user("Weather?"),
                paris(reasoning="think", content="Let me check."),
                result(1, "18C sunny"),
            ],
            "tools": [WEATHER],
        },
        188,
        "b373d9178b6f38a3",
    ),
    "parallel": (
        {
            "messages": [
                user("Weather in Paris and Rome?"),
                assistant(
                    None,
                    reasoning="two calls",
                    tool_calls=[
                        call(1, "get_weather", {"city": "Paris"}),
                        call(2, "get_weather", {"city": "Rome"}),
                    ],
                ),
                result(1, "18C"),
                result(2, "25C"),
            ],
            "tools": [WEATHER],
        },
        214,
        "8078f951003a0946",
    ),
    "tool_unknown_id": (
        {
            "messages": [
                user("x"),
                assistant(None, tool_calls=[call(1, "get_weather", {})]),
                {"role": "tool", "tool_call_id": "nope", "content": "r"},
            ],
            "tools": [WEATHER],
        },
        161,
        "30041d9efea34075",
    ),
    "final_after_tool": (
        {
            "messages": [
                user("Weather?"),
                paris(reasoning="r1"),
                result(1, "18C"),
                assistant("It is 18C.", reasoning="r2"),
                user("And Rome?"),
            ],
            "tools": [WEATHER],
        },
        188,
        "9f5d9f2a3104127b",
    ),
    "agent_loop": (
        {
            "messages": [
                {"role": "system", "content": "You are an agent"},
                user("Plan a trip"),
                assistant(None, reasoning="search first", tool_calls=[call(1, "search", {"q": "trip"})]),
                result(1, "results 1"),
                assistant(
                    "Found some.",
                    reasoning="now weather",
                    tool_calls=[
                        call(2, "get_weather", {"city": "Oslo"}),
                        call(3, "get_weather", {"city": "Bergen"}),
                    ],
                ),
                result(2, "3C"),
                result(3, "5C"),
                assistant("Here is the plan.", reasoning="compose"),
                user("Thanks! Now Rome."),
                assistant(
                    None, reasoning="weather again", tool_calls=[call(4, "get_weather", {"city": "Rome"})]
                ),
                result(4, "20C"),
            ],
            "tools": [WEATHER, SEARCH],
        },
        358,
        "488ff7735b6a46b4",
    ),
    "effort_high": ({"messages": [user("Hi")], "reasoning_effort": "high"}, 68, "2033683fd95afc82"),
    "second_system": (
        {
            "messages": [
                {"role": "system", "content": "A."},
                user("x"),
                {"role": "system", "content": "B"},
                user("y"),
            ]
        },
        90,
        "cebddd876b9307ce",
    ),
}

RESPONSES = {
    "plain": ({"input": "Hello"}, 68, "f721e7552ce6bdad"),
    "instructions": ({"input": "Hi", "instructions": "Be brief"}, 77, "d92ba6a9164e91d1"),
    "agent": (
        {
            "input": [
                user("Weather in Paris?"),
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "I will call the tool."}],
                },
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "get_weather",
                    "arguments": '{"city":"Paris"}',
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
            ],
            "tools": [FLAT_WEATHER],
            "instructions": "You are helpful.",
        },
        185,
        "b9b7a7e0d93e17c3",
    ),
    "agent_final": (
        {
            "input": [
                user("Weather in Paris?"),
                {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "call"}]},
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "get_weather",
                    "arguments": "{}",
                    "id": "fc_1",
                    "status": "completed",
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
                {
                    "type": "reasoning",
                    "summary": [{"type": "summary_text", "text": "s"}],
                    "content": [
                        {"type": "reasoning_text", "text": "a"},
                        {"type": "reasoning_text", "text": "b"},
                    ],
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "It is 18C."}],
                },
                user("Thanks"),
            ],
            "tools": [FLAT_WEATHER],
        },
        179,
        "4a032c0ca0a0d96d",
    ),
    "parallel": (
        {
            "input": [
                user("P and R?"),
                {"type": "function_call", "call_id": "a", "name": "get_weather", "arguments": '{"city":"P"}'},
                {"type": "function_call", "call_id": "b", "name": "get_weather", "arguments": '{"city":"R"}'},
                {"type": "function_call_output", "call_id": "b", "output": "25C"},
                {"type": "function_call_output", "call_id": "a", "output": "18C"},
            ],
            "tools": [FLAT_WEATHER],
        },
        198,
        "086b89bd481267bb",
    ),
    "previous_harmony_messages": (
        {
            "input": "",
            "previous_input_messages": [
                {"author": {"role": "user"}, "content": [{"type": "text", "text": "q"}]},
                {
                    "author": {"role": "assistant"},
                    "content": [{"type": "text", "text": "t"}],
                    "channel": "analysis",
                },
                {
                    "author": {"role": "assistant"},
                    "content": "{}",
                    "channel": "commentary",
                    "recipient": "functions.f",
                    "content_type": "json",
                },
                {
                    "author": {"role": "tool", "name": "functions.f"},
                    "content": [{"type": "text", "text": "r"}],
                    "channel": "commentary",
                    "recipient": "assistant",
                },
            ],
        },
        100,
        "1e192dc09033ea80",
    ),
}


@pytest.mark.parametrize("name", CHAT)
def test_chat_ids_are_vllms(harmony: HarmonyRenderer, name: str) -> None:
    body, count, ids_hash = CHAT[name]
    ids = harmony.harmony_chat_ids(json.loads(json.dumps(body)), start_date=DATE)
    assert (len(ids), digest(ids)) == (count, ids_hash)


@pytest.mark.parametrize("name", RESPONSES)
def test_responses_ids_are_vllms(harmony: HarmonyRenderer, name: str) -> None:
    body, count, ids_hash = RESPONSES[name]
    ids = harmony.harmony_responses_ids(json.loads(json.dumps(body)), start_date=DATE)
    assert (len(ids), digest(ids)) == (count, ids_hash)


def text_of(harmony: HarmonyRenderer, body: dict[str, Any]) -> str:
    return str(harmony.encoding.decode(harmony.harmony_chat_ids(body, start_date=DATE)))


def test_prior_calls_keep_the_legacy_header_and_results_the_new_one(harmony: HarmonyRenderer) -> None:
    text = text_of(harmony, CHAT["call_reasoning"][0])
    # hu:461-525: vLLM rewrites oss-harmony's `assistant<|channel|>commentary to=... <|constrain|>json`.
    assert (
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
        in text
    )
    assert (
        "<|start|>functions.get_weather<|channel|>commentary to=assistant<|message|>18C sunny<|end|>" in text
    )
    assert "<|constrain|>" not in text


def test_reasoning_on_a_tool_call_turn_is_rendered(harmony: HarmonyRenderer) -> None:
    without = harmony.harmony_chat_ids(
        {"messages": [user("Weather?"), paris(), result(1, "18C")]}, start_date=DATE
    )
    body = {"messages": [user("Weather?"), paris(reasoning="I must look it up."), result(1, "18C")]}
    with_reasoning = harmony.harmony_chat_ids(body, start_date=DATE)
    assert "<|channel|>analysis<|message|>I must look it up.<|end|>" in harmony.encoding.decode(
        with_reasoning
    )
    assert len(with_reasoning) > len(without)
    # vLLM's older field name is renamed by its request model and counts the same.
    old_name = {
        "messages": [user("Weather?"), paris(reasoning_content="I must look it up."), result(1, "18C")]
    }
    assert harmony.harmony_chat_ids(old_name, start_date=DATE) == with_reasoning


def test_reasoning_before_the_last_final_answer_is_dropped(harmony: HarmonyRenderer) -> None:
    # hu:230-258: analysis before the last final message goes, the final turn's own included; reasoning after
    # it (the tool-call chain the model is in) stays (test above).
    def body(first: str | None, last: str | None) -> dict[str, Any]:
        def answer(text: str, reasoning: str | None) -> dict[str, Any]:
            return assistant(text, **({"reasoning": reasoning} if reasoning else {}))

        return {
            "messages": [user("2+2?"), answer("4", first), user("3+3?"), answer("6", last), user("thanks")]
        }

    plain = harmony.harmony_chat_ids(body(None, None), start_date=DATE)
    assert harmony.harmony_chat_ids(body("adding", "adding again"), start_date=DATE) == plain


def test_tool_results_are_named_from_the_call_they_answer(harmony: HarmonyRenderer) -> None:
    body = CHAT["parallel"][0]
    text = text_of(harmony, json.loads(json.dumps(body)))
    assert text.count("<|start|>functions.get_weather<|channel|>commentary to=assistant") == 2
    unknown = text_of(harmony, json.loads(json.dumps(CHAT["tool_unknown_id"][0])))
    assert "<|start|>functions.<|channel|>commentary to=assistant<|message|>r<|end|>" in unknown


def test_instructions_become_the_developer_message(harmony: HarmonyRenderer) -> None:
    parts = [{"type": "text", "text": "Be terse."}, {"type": "text", "text": "Use lists."}]
    text = text_of(harmony, {"messages": [{"role": "developer", "content": parts}, user("Hi")]})
    assert (
        "<|start|>developer<|message|># Instructions\n\nBe terse.Use lists.<|end|>" in text
    )  # joined with ""
    assert "<|start|>system<|message|>" in text and "Reasoning: medium" in text


def test_a_server_with_system_instructions_puts_them_in_the_system_message(gpt_oss: Path) -> None:
    server = HarmonyRenderer(load_harmony(gpt_oss).encoding, HarmonyServer(system_instructions=True))
    text = server.encoding.decode(
        server.harmony_chat_ids(
            {"messages": [{"role": "system", "content": "Be brief"}, user("x")]}, start_date=DATE
        )
    )
    assert "trained by OpenAI.\nBe brief\nKnowledge cutoff" in text
    assert "<|start|>developer" not in text


def test_tools_for_tool_choice_none_stay_unless_the_server_excludes_them(harmony: HarmonyRenderer) -> None:
    body = {"messages": [user("x")], "tools": [WEATHER], "tool_choice": "none"}
    assert "type get_weather" in text_of(harmony, body)
    excluding = HarmonyRenderer(harmony.encoding, HarmonyServer(exclude_tools_when_tool_choice_none=True))
    assert "type get_weather" not in excluding.encoding.decode(
        excluding.harmony_chat_ids(body, start_date=DATE)
    )


def test_forwarded_prompt_ids_are_the_prompt(harmony: HarmonyRenderer) -> None:
    body = {"messages": [user("x")], "kv_transfer_params": {"prompt_token_ids": [200006, 1428, 200008]}}
    assert harmony.harmony_chat_ids(body, start_date=DATE) == [200006, 1428, 200008]


REFUSED_CHAT = {
    "effort none": {"reasoning_effort": "none"},
    "effort minimal": {"reasoning_effort": "minimal"},
    "effort xhigh": {"reasoning_effort": "xhigh"},
    "effort max": {"reasoning_effort": "max"},
    "effort outside the Literal": {"reasoning_effort": SECRET},
    "empty tools": {"tools": []},
    "tool_choice without tools": {"tool_choice": "required"},
    "named tool_choice of no tool": {
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": SECRET}},
    },
    "tool without a name": {"tools": [{"type": "function", "function": {"description": SECRET}}]},
    "both generation flags": {"add_generation_prompt": True, "continue_final_message": True},
    "unknown role": {"messages": [{"role": SECRET, "content": "x"}]},
    "null user content": {"messages": [{"role": "user", "content": None}]},
    "string parts only": {"messages": [{"role": "user", "content": [SECRET]}]},
    "tool call without id": {
        "messages": [user("x"), assistant(None, tool_calls=[{"function": {"name": SECRET}}])]
    },
    "non-string reasoning": {"messages": [user("x"), assistant("y", reasoning=5)]},
    "forwarded ids out of vocabulary": {"kv_transfer_params": {"prompt_token_ids": [201088]}},
}


@pytest.mark.parametrize("name", REFUSED_CHAT)
def test_chat_refusals_are_vllms_and_quote_nothing(harmony: HarmonyRenderer, name: str) -> None:
    body = {"messages": [user(SECRET)], **REFUSED_CHAT[name]}
    with pytest.raises(ServerRefuses) as err:
        harmony.harmony_chat_ids(body, start_date=DATE)
    assert str(err.value).startswith(REFUSES)
    assert SECRET not in str(err.value)


REFUSED_RESPONSES = {
    "effort none": {"reasoning": {"effort": "none"}},
    "effort xhigh": {"reasoning": {"effort": "xhigh"}},
    "output of no call": {
        "input": [user(SECRET), {"type": "function_call_output", "call_id": SECRET, "output": "1"}]
    },
    "item of an unread type": {"input": [{"type": "item_reference", "id": SECRET}]},
    "tool role item": {"input": [{"role": "tool", "content": SECRET}]},
    "mcp beside a function": {"tools": [{"type": "mcp", "server_label": SECRET}, FLAT_WEATHER]},
    "output logprobs": {"include": ["message.output_text.logprobs"]},
}


@pytest.mark.parametrize("name", REFUSED_RESPONSES)
def test_responses_refusals_are_vllms_and_quote_nothing(harmony: HarmonyRenderer, name: str) -> None:
    body = {"input": SECRET, **REFUSED_RESPONSES[name]}
    with pytest.raises(ServerRefuses) as err:
        harmony.harmony_responses_ids(body, start_date=DATE)
    assert str(err.value).startswith(REFUSES)
    assert SECRET not in str(err.value)


def test_a_previous_response_id_is_not_counted(harmony: HarmonyRenderer) -> None:
    with pytest.raises(InvalidBody) as err:
        harmony.harmony_responses_ids({"input": "x", "previous_response_id": "resp_1"}, start_date=DATE)
    assert not isinstance(err.value, ServerRefuses)  # vLLM answers 404 while its store is off


def test_the_start_date_is_the_servers(harmony: HarmonyRenderer) -> None:
    assert server_date("2025-02-28") == "2025-02-28"
    assert server_date(None, datetime(2026, 3, 1, 23, 30, tzinfo=UTC)) == "2026-03-01"
    assert server_date("", datetime(2026, 3, 1, tzinfo=UTC)) == "2026-03-01"  # vLLM: an empty pin is unset
    late = datetime(2026, 3, 1, 23, 30, tzinfo=timezone(timedelta(hours=-5)))  # the clock's own zone
    assert server_date(None, late) == "2026-03-01"
    body = {"messages": [user("x")]}
    ids = harmony.harmony_chat_ids(body, start_date="2025-02-28")
    assert "Current date: 2025-02-28\n" in harmony.encoding.decode(ids)
    assert len(ids) == len(harmony.harmony_chat_ids(body, start_date=DATE))


def test_the_vocabulary_is_derived_from_the_models_tokenizer(gpt_oss: Path, tmp_path: Path) -> None:
    target = tiktoken_vocab(gpt_oss / "tokenizer.json", tmp_path)
    assert target == tmp_path / VOCAB_FILE
    assert hashlib.sha256(target.read_bytes()).hexdigest() == VOCAB_SHA256
    assert [p.name for p in tmp_path.iterdir()] == [VOCAB_FILE]


def test_another_models_vocabulary_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TokenizerLoadError, match="not gpt-oss's vocabulary"):
        tiktoken_vocab(shared_dir("llama-3.1") / "tokenizer.json", tmp_path)  # byte-level BPE too
    assert not (tmp_path / VOCAB_FILE).exists()
    with pytest.raises(TokenizerLoadError, match="not a byte-level BPE"):  # SentencePiece's "▁" pieces
        tiktoken_vocab(shared_dir("mistral-7b-instruct-v0.1") / "tokenizer.json", tmp_path)


LOAD = """
import json, os, sys
from pathlib import Path
from proxy.core.renderers.harmony import load_harmony
before = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
h = load_harmony(Path(sys.argv[1]))
print(json.dumps([before, os.environ.get("TIKTOKEN_ENCODINGS_BASE"), len(h.harmony_chat_ids({"messages": [{"role": "user", "content": "Hello there"}]}, start_date="2026-01-15"))]))
"""


@pytest.mark.slow  # two new interpreters; the fast lane loads harmony in-process (the tests above)
def test_fresh_processes_load_offline_and_leave_the_environment_alone(gpt_oss: Path, tmp_path: Path) -> None:
    # The first derives the vocabulary into $ISLWATCH_CACHE, the second finds it there; each loads with
    # TIKTOKEN_ENCODINGS_BASE pointed at it and then puts back what was there before (nothing, or a folder).
    for preset in (None, "/nowhere/else"):
        env = {k: v for k, v in os.environ.items() if k != "TIKTOKEN_ENCODINGS_BASE"}
        env |= {"ISLWATCH_CACHE": str(tmp_path), "PYTHONPATH": str(REPO)}
        env |= {"TIKTOKEN_ENCODINGS_BASE": preset} if preset else {}
        run = [sys.executable, "-c", LOAD, str(gpt_oss)]
        out = subprocess.run(run, env=env, capture_output=True, text=True, check=True)
        assert json.loads(out.stdout) == [preset, preset, 69]
    (vocab,) = (tmp_path / "harmony").glob(f"*/{VOCAB_FILE}")
    assert hashlib.sha256(vocab.read_bytes()).hexdigest() == VOCAB_SHA256


class OldLibrary:
    """openai-harmony 0.0.8's rendering of a tool turn (the headers vLLM 0.32 does not send)."""

    def render_conversation_for_completion(self, *args: Any) -> list[int]:
        return []

    def decode(self, ids: list[int]) -> str:
        return (
            "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|call|>"
            "<|start|>functions.f to=assistant<|channel|>commentary<|message|>r<|end|><|start|>assistant"
        )


def test_a_library_rendering_otherwise_than_vllms_is_refused(harmony: HarmonyRenderer) -> None:
    check_library(harmony.encoding)
    with pytest.raises(TokenizerLoadError, match="oss-harmony"):
        check_library(OldLibrary())


# --- Where the Hugging Face template (islwatch's count before) and vLLM's Harmony prompt differ -----------


@pytest.fixture(scope="module")
def jinja(gpt_oss: Path) -> Any:
    return load_tokenizer(str(gpt_oss)).tokenizer


def both(jinja: Any, harmony: HarmonyRenderer, body: dict[str, Any]) -> tuple[int | None, int]:
    template = count_request(jinja, "chat", json.loads(json.dumps(body))).expected_server
    return template, len(harmony.harmony_chat_ids(json.loads(json.dumps(body)), start_date=DATE))


def test_the_template_agrees_on_plain_chat(jinja: Any, harmony: HarmonyRenderer) -> None:
    for name in ("plain", "system_dot", "effort_high"):
        template, vllm = both(jinja, harmony, CHAT[name][0])
        assert template == vllm, name


def test_the_template_adds_a_token_to_a_system_prompt_without_a_final_period(
    jinja: Any, harmony: HarmonyRenderer
) -> None:
    # The template writes "You are helpful\n\n" before <|end|>; vLLM the text alone ("helpful." + "\n\n" is
    # one token, so a final period hides it).
    template, vllm = both(jinja, harmony, CHAT["system_nodot"][0])
    assert template == vllm + 1


def test_the_template_quotes_tool_results(jinja: Any, harmony: HarmonyRenderer) -> None:
    # `"18C sunny"` JSON-quoted, header `functions.get_weather to=assistant<|channel|>commentary`: +2.
    body = {"messages": [user("Weather?"), paris(), result(1, "18C sunny")], "tools": [WEATHER]}
    template, vllm = both(jinja, harmony, body)
    assert template == vllm + 2


def test_the_template_drops_a_parallel_call_and_later_system_messages(
    jinja: Any, harmony: HarmonyRenderer
) -> None:
    template, vllm = both(jinja, harmony, CHAT["parallel"][0])
    assert template == vllm - 15  # the second call is not rendered (+2 per quoted result)
    template, vllm = both(jinja, harmony, CHAT["second_system"][0])
    assert template == vllm - 8  # vLLM writes a later system message as a developer message


def test_the_template_renders_reasoning_alone_as_an_empty_final_answer(
    jinja: Any, harmony: HarmonyRenderer
) -> None:
    body = {"messages": [user("q"), assistant("", reasoning="thinking only"), user("go on")]}
    template, vllm = both(jinja, harmony, body)
    assert template == vllm - 2  # vLLM: the reasoning as analysis, no final message


def test_the_template_refuses_what_vllm_renders(jinja: Any, harmony: HarmonyRenderer) -> None:
    # A tool without parameters (the template concatenates None), text beside reasoning on a tool-call turn.
    for name in ("tools", "call_with_text"):
        result_ = count_request(jinja, "chat", json.loads(json.dumps(CHAT[name][0])))
        assert result_.fallback_reason == "template_error", name
        assert (
            len(harmony.harmony_chat_ids(json.loads(json.dumps(CHAT[name][0])), start_date=DATE))
            == CHAT[name][1]
        )
