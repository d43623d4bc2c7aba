"""core/model.py: what a server renders a request with, beyond the request itself: the processor's chat
template for requests without tools (vLLM's resolve_chat_template), the server's default template kwargs,
the renderer chosen by the model folder. Expected values come from transformers' own apply_chat_template
called with the template and kwargs the server's rule names, not from islwatch's counting path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from proxy.core.count import SERVER_REFUSES
from proxy.core.flavors import flavor_named
from proxy.core.model import load_served_model
from proxy.core.renderers import HARMONY, JINJA, MISTRAL
from proxy.core.server_settings import ServerSettings
from tests.conftest import shared_dir

ASK = [{"role": "user", "content": "What is the capital of France?"}]
TOOLS = [
    {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}
]
# A processor template that differs from the tokenizer's (Qwen2-VL's folders ship the text template in
# tokenizer_config.json and the vision one in chat_template.json).
VISION_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\nVISION {{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def templated(tok: object, template: str | None, **kwargs: object) -> int:
    text = tok.apply_chat_template(
        ASK, tokenize=False, add_generation_prompt=True, chat_template=template, **kwargs
    )  # type: ignore[attr-defined]
    return len(tok(text, add_special_tokens=False)["input_ids"])  # type: ignore[operator]


@pytest.fixture(scope="module")
def vision_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("vl") / "qwen-vl"
    shutil.copytree(shared_dir("qwen2.5-instruct"), folder)
    (folder / "preprocessor_config.json").write_text(
        json.dumps({"image_processor_type": "Qwen2VLImageProcessor"})
    )
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": VISION_TEMPLATE}))
    return folder


def test_without_tools_the_processor_template_renders(vision_folder: Path) -> None:
    model = load_served_model(str(vision_folder))
    tok = model.tokenizer
    plain = model.count("chat", {"messages": ASK})
    with_tools = model.count("chat", {"messages": ASK, "tools": TOOLS})
    assert plain.expected_server == templated(tok, VISION_TEMPLATE)
    assert with_tools.expected_server == templated(tok, None, tools=TOOLS)  # the tokenizer's own
    assert model.describe()["template_source"] == (
        "chat_template.json (requests without tools), tokenizer_config.json (with tools)"
    )


def test_a_server_chat_template_wins_over_the_processor(vision_folder: Path, tmp_path: Path) -> None:
    override = tmp_path / "t.jinja"
    override.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    model = load_served_model(str(vision_folder), chat_template_file=str(override))
    assert model.count("chat", {"messages": ASK}).expected_server == templated(
        model.tokenizer, override.read_text()
    )
    assert model.describe()["template_source"] == "--chat-template"


@pytest.mark.slow  # loads a processor (seconds)
def test_llama_cpp_never_takes_the_processor_template(vision_folder: Path) -> None:
    model = load_served_model(str(vision_folder), "llama.cpp")
    assert model.processor_encoder is None
    assert model.count("chat", {"messages": ASK}).expected_server != templated(
        model.tokenizer, VISION_TEMPLATE
    )


@pytest.mark.slow
def test_sglang_takes_the_processor_template_of_a_multimodal_model(
    vision_folder: Path, tmp_path: Path
) -> None:
    """sglang/srt/parser/template_manager.py `_resolve_hf_chat_template`: the processor's template first, for
    every request, when the model is multimodal (only then is a processor loaded)."""
    text_model = load_served_model(str(vision_folder), "sglang")  # no config.json: no processor loaded
    assert text_model.count("chat", {"messages": ASK}).expected_server != templated(
        text_model.tokenizer, VISION_TEMPLATE
    )
    folder = tmp_path / "qwen2-vl"
    shutil.copytree(vision_folder, folder)
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen2VLForConditionalGeneration"]}))
    model = load_served_model(str(folder), "sglang")
    assert model.count("chat", {"messages": ASK}).expected_server == templated(
        model.tokenizer, VISION_TEMPLATE
    )
    override = tmp_path / "vision.jinja"
    override.write_text(VISION_TEMPLATE)
    given = load_served_model(str(folder), "sglang", chat_template_file=str(override))
    for body in ({"messages": ASK}, {"messages": ASK, "tools": TOOLS}):  # the same with tools, unlike vLLM
        assert model.count("chat", body).expected_server == given.count("chat", body).expected_server
    assert model.describe()["template_source"] == "chat_template.json"


@pytest.mark.slow
def test_server_default_template_kwargs_lie_under_the_request() -> None:
    """vLLM's --default-chat-template-kwargs '{"enable_thinking": false}' on a Qwen3 server: every request
    renders with thinking off unless it asks otherwise; a null request value keeps the default."""
    folder = str(shared_dir("qwen3"))
    default = load_served_model(folder)
    off = load_served_model(folder, settings=ServerSettings({"enable_thinking": False}))
    tok = default.tokenizer
    body = {"messages": ASK}
    assert default.count("chat", body).expected_server == templated(tok, None)
    assert off.count("chat", body).expected_server == templated(tok, None, enable_thinking=False)
    assert templated(tok, None, enable_thinking=False) != templated(tok, None)  # the setting matters
    asks_on = {**body, "chat_template_kwargs": {"enable_thinking": True}}
    assert off.count("chat", asks_on).expected_server == templated(tok, None, enable_thinking=True)
    keeps = {**body, "chat_template_kwargs": {"enable_thinking": None}}
    assert off.count("chat", keeps).expected_server == templated(tok, None, enable_thinking=False)
    effort = {**body, "reasoning_effort": "high"}  # build_chat_params: effort turns thinking on
    assert off.count("chat", effort).expected_server == templated(tok, None, enable_thinking=True)


def test_the_folder_picks_the_renderer(tmp_path: Path) -> None:
    gpt = tmp_path / "gpt"
    gpt.mkdir()
    (gpt / "config.json").write_text(json.dumps({"model_type": "gpt_oss"}))
    nemo = tmp_path / "nemo"
    nemo.mkdir()
    (nemo / "tekken.json").write_text("{}")
    vllm, auto, hf = flavor_named("vllm"), ServerSettings(), ServerSettings(tokenizer_mode="hf")
    assert vllm.renderer(gpt, auto) == HARMONY
    assert vllm.renderer(nemo, auto) == JINJA  # no consolidated weights: vLLM's auto mode stays hf
    (nemo / "consolidated.safetensors").write_bytes(b"")
    assert vllm.renderer(nemo, auto) == MISTRAL
    assert vllm.renderer(nemo, hf) == JINJA
    for other in ("sglang", "llama.cpp"):  # both render gpt-oss's Jinja template with their own engines
        assert flavor_named(other).renderer(gpt, auto) == JINJA


def test_reasoning_on_a_tool_call_turn_is_counted() -> None:
    """The agent turn: reasoning and a tool call, then its result. Qwen3's template keeps reasoning after the
    last user turn; dropping it (islwatch before) undercounted by the reasoning's tokens and more."""
    model = load_served_model(str(shared_dir("qwen3")))
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    turn = {"role": "assistant", "content": "", "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": "c1", "content": "sunny"}

    def n(assistant: dict[str, object]) -> int | None:
        return model.count("chat", {"messages": [*ASK, assistant, result], "tools": TOOLS}).expected_server

    bare, legacy, modern = (
        n(turn),
        n({**turn, "reasoning_content": "Look it up."}),
        n({**turn, "reasoning": "Look it up."}),
    )
    assert bare is not None and legacy == modern and modern > bare
    refused = model.count("chat", {"messages": ASK, "reasoning_effort": "extreme"})
    assert refused.fallback_reason == SERVER_REFUSES
