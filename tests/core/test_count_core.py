"""The accounting core against real tokenizers and independent counts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.core.count import (
    BARE_FALLBACK,
    CHAT_TEMPLATE,
    INVALID_BODY,
    NO_TEMPLATE,
    PLAIN_ENCODE,
    TEMPLATE_ERROR,
    TOKEN_IDS,
    count_request,
)
from proxy.core.extract import chat_input
from proxy.core.tokens import iterates_content_parts
from tests.builders import build_tokenizer
from tests.conftest import load_builtin


def independent_chat_ids(tok: Any, messages: list[dict[str, Any]], **kw: Any) -> list[int]:
    """Render with Jinja, then encode with the raw Rust tokenizer: a second path to the server's ids."""
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kw)
    return tok.backend_tokenizer.encode(text, add_special_tokens=False).ids


def chat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": messages, **extra}


LONG = " ".join(f"word{i % 97} and some more text, number {i}." for i in range(1400))  # ~8k tokens

# (name, messages, whether the template needs alternation with no system role)
SHAPES: list[tuple[str, list[dict[str, Any]]]] = [
    ("one_turn", [{"role": "user", "content": "What is the capital of France?"}]),
    (
        "three_turns",
        [
            {"role": "user", "content": "Hello! What is 2+2?"},
            {"role": "assistant", "content": "2+2 equals 4."},
            {"role": "user", "content": "Thanks. Now say it in French."},
        ],
    ),
    (
        "multipart_text",
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "First part."}, {"type": "text", "text": "Second."}],
            }
        ],
    ),
    (
        "unicode",
        [{"role": "user", "content": "Café naïve 東京 🙂 Ελληνικά\t tabs  and  double  spaces\n\nend"}],
    ),
    ("empty_string", [{"role": "user", "content": ""}]),
    ("long_8k", [{"role": "user", "content": LONG}]),
]
SYSTEM = {"role": "system", "content": "You are terse."}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def prepared(tok: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return chat_input(chat(messages)).messages


@pytest.mark.parametrize("name,messages", SHAPES, ids=[s[0] for s in SHAPES])
def test_shared_templated_equals_independent_ids(shared_tok: Any, name: str, messages: list[dict]) -> None:
    result = count_request(shared_tok, "chat", chat(messages))
    assert result.fallback_reason is None, result
    assert result.method == CHAT_TEMPLATE
    assert result.templated == len(independent_chat_ids(shared_tok, prepared(shared_tok, messages)))
    assert result.expected_server == result.templated
    assert result.bare == sum(
        len(shared_tok.backend_tokenizer.encode(t, add_special_tokens=False).ids)
        for m in chat_input(chat(messages)).texts
        for t in [m]
        if t
    )
    assert result.messages == len(messages)


# Reference counts published in the shared SOURCES.md that the test tokenizers reproduce (transformers 5.x column).
SOURCES_COUNTS = {
    "mistral-7b-instruct-v0.1": (15, 40),
    "qwen2.5-instruct": (36, 63),
    "llama-3-8b-instruct": (17, 44),
    "phi-3-mini-4k-instruct": (10, 31),
    "tinyllama-1.1b-chat-v1.0": (22, 56),
    "smollm2-135m-instruct": (37, 65),
    "deepseek-v3": (10, 30),
}


def test_shared_counts_match_sources_md(shared_family: str, shared_tok: Any) -> None:
    one, three = SOURCES_COUNTS[shared_family]
    assert count_request(shared_tok, "chat", chat(SHAPES[0][1])).templated == one
    assert count_request(shared_tok, "chat", chat(SHAPES[1][1])).templated == three


def test_shared_system_prompt(shared_family: str, shared_tok: Any) -> None:
    messages = [SYSTEM, {"role": "user", "content": "Hi there."}]
    result = count_request(shared_tok, "chat", chat(messages))
    if shared_family == "mistral-7b-instruct-v0.1":  # its template raises on a system role
        assert result.fallback_reason == TEMPLATE_ERROR
        assert result.expected_server == result.bare and result.templated is None
    else:
        assert result.templated == len(independent_chat_ids(shared_tok, prepared(shared_tok, messages)))


def test_shared_image_parts_counted_and_dropped(shared_tok: Any) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "Describe this."}, IMAGE, IMAGE]}]
    result = count_request(shared_tok, "chat", chat(messages))
    assert result.media_parts == {"image": 2}
    text_only = count_request(shared_tok, "chat", chat([{"role": "user", "content": "Describe this."}]))
    assert result.templated == text_only.templated


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
TOOL_CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'},
]


def test_shared_tools_go_through_template(shared_family: str, shared_tok: Any) -> None:
    result = count_request(shared_tok, "chat", chat(TOOL_CONVERSATION, tools=TOOLS))
    assert result.tools is True
    if result.fallback_reason is not None:  # templates that reject the tool role (Mistral v0.1, Phi-3...)
        assert result.fallback_reason == TEMPLATE_ERROR
        return
    prepared_msgs = chat_input(chat(TOOL_CONVERSATION)).messages
    assert prepared_msgs[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert prepared_msgs[1]["content"] == ""  # null content, as vLLM prepares it
    assert result.templated == len(independent_chat_ids(shared_tok, prepared_msgs, tools=TOOLS))
    if shared_family == "qwen2.5-instruct":  # a tool-aware template: tools cost tokens
        without = count_request(shared_tok, "chat", chat(TOOL_CONVERSATION))
        assert result.templated > without.templated


MISTRAL_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Translate 'good morning' to German, please.",
    "Unicode: café, 東京, Ελληνικά.",
    "List three prime numbers:\n1.\n2.\n3.",
    LONG[:2000],
]


@pytest.fixture(scope="module")
def mistral_v1() -> Any:
    """mistral-common's own v1 tokenizer: the reference encoding of Mistral v0.1 chats."""
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    return MistralTokenizer.v1()


@pytest.mark.parametrize("text", MISTRAL_PROMPTS, ids=[f"prompt{i}" for i in range(len(MISTRAL_PROMPTS))])
def test_mistral_common_single_turn_equal_encode_chat_completion(mistral_v1: Any, text: str) -> None:
    from mistral_common.protocol.instruct.messages import UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    tok = load_builtin().tokenizer
    expected = mistral_v1.encode_chat_completion(
        ChatCompletionRequest(messages=[UserMessage(content=text)])
    ).tokens
    result = count_request(tok, "chat", chat([{"role": "user", "content": text}]))
    assert result.templated == len(expected), text[:40]
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)[
        "input_ids"
    ]
    assert ids == expected


def test_mistral_common_continued_assistant_prefix(mistral_v1: Any) -> None:
    """A prefilled assistant message, continued: the wire form of mistral-common's final assistant prefix."""
    from mistral_common.protocol.instruct.messages import AssistantMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    tok = load_builtin().tokenizer
    req = ChatCompletionRequest(
        messages=[UserMessage(content="Say hi."), AssistantMessage(content="Hi", prefix=True)]
    )
    expected = mistral_v1.encode_chat_completion(req).tokens
    body = chat(
        [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi"}],
        continue_final_message=True,
        add_generation_prompt=False,
    )
    assert count_request(tok, "chat", body).templated == len(expected)


# --- the four template styles, on tokenizers built here ---------------------------------------------------


@pytest.mark.parametrize("style", ["chatml", "llama3", "inst", "parts"])
def test_built_styles_one_turn_exact(style: str) -> None:
    tok = build_tokenizer(style)
    messages = [{"role": "user", "content": "Hello! What is the capital of France?"}]
    result = count_request(tok, "chat", chat(messages))
    assert result.method == CHAT_TEMPLATE
    assert result.templated == len(independent_chat_ids(tok, prepared(tok, messages)))
    assert result.templated > result.bare  # wrapping costs tokens in every style


def test_chatml_default_system_prompt_is_counted() -> None:
    tok = build_tokenizer("chatml")
    user = [{"role": "user", "content": "Hi."}]
    own = [{"role": "system", "content": "S."}, *user]
    default = count_request(tok, "chat", chat(user)).templated
    explicit = count_request(tok, "chat", chat(own)).templated
    default_prompt = len(tok("You are a helpful assistant.", add_special_tokens=False)["input_ids"])
    short_prompt = len(tok("S.", add_special_tokens=False)["input_ids"])
    assert default - explicit == default_prompt - short_prompt


def test_llama3_style_bos_from_template_not_twice() -> None:
    tok = build_tokenizer("llama3")
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)[
        "input_ids"
    ]
    result = count_request(tok, "chat", chat([{"role": "user", "content": "Hi"}]))
    assert result.templated == len(ids)
    assert ids.count(tok.bos_token_id) == 1
    double = count_request(tok, "chat", chat([{"role": "user", "content": "Hi"}], add_special_tokens=True))
    assert double.expected_server == result.templated + 1  # vLLM's add_special_tokens=True adds a 2nd BOS


def test_inst_style_rejects_system_role() -> None:
    tok = build_tokenizer("inst")
    result = count_request(tok, "chat", chat([SYSTEM, {"role": "user", "content": "Hi"}]))
    assert result.fallback_reason == TEMPLATE_ERROR and result.method == BARE_FALLBACK
    assert (
        result.expected_server
        == result.bare
        == count_request(
            tok, "completions", {"prompt": ["You are terse.", "Hi"], "add_special_tokens": False}
        ).expected_server
    )


def test_parts_style_iterates_parts_and_keeps_media_placeholders() -> None:
    tok = build_tokenizer("parts")
    assert iterates_content_parts(tok.chat_template)
    assert not iterates_content_parts(build_tokenizer("chatml").chat_template)
    with_image = [{"role": "user", "content": [{"type": "text", "text": "Look:"}, IMAGE]}]
    text_only = [{"role": "user", "content": [{"type": "text", "text": "Look:"}]}]
    a = count_request(tok, "chat", chat(with_image))
    b = count_request(tok, "chat", chat(text_only))
    assert a.media_parts == {"image": 1}
    assert a.templated == b.templated + 1  # the template renders the image placeholder as one token


def test_no_template_short_circuits_to_bare() -> None:
    tok = build_tokenizer("chatml")
    tok.chat_template = None
    result = count_request(tok, "chat", chat([{"role": "user", "content": "Hello there"}]))
    assert result.fallback_reason == NO_TEMPLATE and result.templated is None
    assert (
        result.expected_server
        == result.bare
        == len(tok("Hello there", add_special_tokens=False)["input_ids"])
    )


def test_multipart_text_joined_with_newline_for_string_templates() -> None:
    tok = build_tokenizer("chatml")
    parts = chat(
        [{"role": "user", "content": [{"type": "text", "text": "A b"}, {"type": "text", "text": "C d"}]}]
    )
    joined = chat([{"role": "user", "content": "A b\nC d"}])
    assert count_request(tok, "chat", parts).templated == count_request(tok, "chat", joined).templated


def test_request_fields_change_rendering() -> None:
    tok = build_tokenizer("chatml")
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]
    gen = count_request(tok, "chat", chat(msgs)).templated
    no_gen = count_request(tok, "chat", chat(msgs, add_generation_prompt=False)).templated
    cont = count_request(tok, "chat", chat(msgs, continue_final_message=True, add_generation_prompt=False))
    assert gen - no_gen == len(tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"])
    assert cont.templated == no_gen - len(tok("<|im_end|>\n", add_special_tokens=False)["input_ids"])
    kw = count_request(tok, "chat", chat(msgs, chat_template_kwargs={"add_generation_prompt": False}))
    assert kw.fallback_reason in (None, TEMPLATE_ERROR)  # a kwarg clash is reported, never raised


# --- completions, embeddings, responses ---------------------------------------------------------------------


def plain_len(tok: Any, text: str) -> int:
    return len(tok(text, add_special_tokens=True)["input_ids"])


def test_completions_prompt_shapes(shared_tok: Any) -> None:
    def plain(text: str) -> int:
        return plain_len(shared_tok, text)

    one = count_request(shared_tok, "completions", {"prompt": "The sky is"})
    assert one.method == PLAIN_ENCODE and one.expected_server == plain("The sky is")
    many = count_request(shared_tok, "completions", {"prompt": ["The sky is", "Roses are red"]})
    assert many.prompts == (plain("The sky is"), plain("Roses are red"))
    assert many.expected_server == sum(many.prompts)
    ids = count_request(shared_tok, "completions", {"prompt": [1, 2, 3]})
    assert ids.method == TOKEN_IDS and ids.expected_server == 3
    lists = count_request(shared_tok, "completions", {"prompt": [[1, 2], [3, 4, 5]]})
    assert lists.prompts == (2, 3) and lists.expected_server == 5


def test_embeddings_inputs_encoded_one_by_one(shared_tok: Any) -> None:
    emb = count_request(shared_tok, "embeddings", {"input": ["a b c", "d"]})
    assert emb.expected_server == plain_len(shared_tok, "a b c") + plain_len(shared_tok, "d")


def test_completions_flags_prompt_that_already_starts_with_bos() -> None:
    tok = load_builtin().tokenizer
    rendered = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    result = count_request(tok, "completions", {"prompt": rendered})
    assert result.bos_prefixed_prompt
    assert result.expected_server == len(tok(rendered, add_special_tokens=False)["input_ids"]) + 1
    assert not count_request(tok, "completions", {"prompt": "Hi"}).bos_prefixed_prompt


def test_responses_instructions_count_as_a_system_message(shared_tok: Any) -> None:
    body = {"model": "m", "instructions": "Be brief.", "input": "What is 2+2?"}
    result = count_request(shared_tok, "responses", body)
    as_chat = count_request(
        shared_tok,
        "chat",
        chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]),
    )
    assert (result.templated, result.fallback_reason) == (as_chat.templated, as_chat.fallback_reason)


def test_responses_input_items_count_as_messages(shared_tok: Any) -> None:
    items = {
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]
    }
    result = count_request(shared_tok, "responses", items)
    as_chat = count_request(shared_tok, "chat", chat([{"role": "user", "content": "Hi"}]))
    assert result.templated == as_chat.templated
    # vLLM encodes a Responses prompt with special tokens (tests/vllm): the chat extension's count.
    with_specials = chat([{"role": "user", "content": "Hi"}])
    with_specials["add_special_tokens"] = True
    assert result.expected_server == count_request(shared_tok, "chat", with_specials).expected_server


@pytest.mark.parametrize(
    "endpoint,body",
    [
        ("chat", {}),
        ("chat", {"messages": "hi"}),
        ("chat", {"messages": [{"content": "no role"}]}),
        ("chat", {"messages": [{"role": "user", "content": 5}]}),
        ("chat", [1, 2]),
        ("completions", {"prompt": 5}),
        ("completions", {"prompt": [1, "a"]}),
        ("embeddings", {}),
        ("responses", {"input": 3}),
    ],
)
def test_invalid_bodies_are_reasons_not_errors(endpoint: str, body: Any) -> None:
    tok = build_tokenizer("chatml")
    result = count_request(tok, endpoint, body)
    assert result.fallback_reason == INVALID_BODY and result.expected_server is None
    assert result.detail


def test_count_result_is_json_serialisable() -> None:
    tok = build_tokenizer("chatml")
    json.dumps(count_request(tok, "chat", chat([{"role": "user", "content": "x"}])).as_dict())


def test_chat_style_embeddings_default_to_no_generation_prompt() -> None:
    tok = build_tokenizer("chatml")
    msgs = [{"role": "user", "content": "Embed me"}]
    emb = count_request(tok, "embeddings", {"messages": msgs})
    assert emb.templated == count_request(tok, "chat", chat(msgs, add_generation_prompt=False)).templated
    assert emb.templated < count_request(tok, "chat", chat(msgs)).templated
