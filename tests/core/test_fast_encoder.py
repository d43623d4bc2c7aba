"""count(FastEncoder(tok), ...) returns exactly what count_request returns, on real and test-built tokenizers,
in many shapes; each shortcut is proven at load or off."""

from __future__ import annotations

from functools import cache, lru_cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.count import count, count_request
from proxy.core.encoders import ReferenceEncoder
from proxy.core.extract import chat_input
from proxy.core.fallbacks import FALLBACK_REASONS
from proxy.core.fast import FastEncoder, best_encoder
from proxy.core.tokens import render_chat, render_messages
from tests.builders import SPECIALS, TEMPLATES, build_tokenizer
from tests.conftest import FAMILIES, load_builtin, load_shared

BUILT = [(style, None) for style in TEMPLATES] + [("chatml", True), ("llama3", False)]


@cache
def shared_counter(family: str) -> FastEncoder:
    return FastEncoder(load_shared(family).tokenizer)


@cache
def built_counter(style: str, add_bos: bool | None) -> FastEncoder:
    return FastEncoder(build_tokenizer(style, add_bos))


@lru_cache(maxsize=1)
def builtin_counter() -> FastEncoder:
    return FastEncoder(load_builtin().tokenizer)


def all_counters() -> list[tuple[str, Any]]:
    """(id, factory) pairs: factories so a missing shared folder skips only its own test."""
    out: list[tuple[str, Any]] = [(f"built-{s}-{b}", lambda s=s, b=b: built_counter(s, b)) for s, b in BUILT]
    out += [(f, lambda f=f: shared_counter(f)) for f in FAMILIES]
    out.append(("builtin-mistral", builtin_counter))
    return out


COUNTERS = all_counters()


@pytest.fixture(params=[f for _, f in COUNTERS], ids=[i for i, _ in COUNTERS])
def counter(request: pytest.FixtureRequest) -> FastEncoder:
    return request.param()


def turns(n: int, texts: list[str]) -> list[dict[str, Any]]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": texts[i % len(texts)]} for i in range(n)
    ]


TEXTS = [
    "What is the capital of France?",
    " Paris.\n",
    "  spaced  out  \n\n",
    "It's 2024; 12345 tokens, café 東京 🙂",
    "",
    "\nnewline first",
    "<|im_start|>user\nfake turn<|im_end|>",  # added-token text inside content
    "<s>[INST] nested [/INST]</s>",
    "<|eot_id|><|start_header_id|>x<|end_header_id|>",
]

BODIES: list[tuple[str, Any]] = [
    ("chat", {"messages": [{"role": "user", "content": TEXTS[0]}]}),
    ("chat", {"messages": turns(3, TEXTS)}),
    ("chat", {"messages": turns(7, TEXTS[3:])}),
    ("chat", {"messages": [{"role": "system", "content": "Be brief."}, *turns(3, TEXTS[5:])]}),
    ("chat", {"messages": turns(3, TEXTS), "add_generation_prompt": False}),
    ("chat", {"messages": turns(3, TEXTS), "add_special_tokens": True}),
    ("chat", {"messages": turns(2, TEXTS), "continue_final_message": True, "add_generation_prompt": False}),
    ("chat", {"messages": [{"role": "user", "content": None}]}),
    (
        "chat",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look"},
                        {"type": "image_url", "image_url": {"url": "data:,"}},
                        {"type": "text", "text": " twice"},
                    ],
                }
            ]
        },
    ),
    (
        "chat",
        {
            "messages": [{"role": "user", "content": "weather?"}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}],
        },
    ),
    ("chat", {"messages": []}),
    ("chat", {"messages": [{"content": "no role"}]}),
    ("chat", "not an object"),
    ("completions", {"prompt": "Once upon a time"}),
    ("completions", {"prompt": ["a", "b c", [1, 2, 3]]}),
    ("completions", {"prompt": "<s>already has BOS", "add_special_tokens": False}),
    ("embeddings", {"input": ["one", "two"]}),
    ("embeddings", {"messages": [{"role": "user", "content": "embed me"}]}),
    ("responses", {"input": "hello", "instructions": "Be kind."}),
    ("responses", {"input": 3}),
]


@pytest.mark.parametrize(("endpoint", "body"), BODIES, ids=[f"{e}-{i}" for i, (e, _) in enumerate(BODIES)])
def test_equal_to_count_request(counter: FastEncoder, endpoint: str, body: Any) -> None:
    assert count(counter, endpoint, body) == count_request(counter.tok, endpoint, body)


def test_growing_conversation_equal_and_reused(counter: FastEncoder) -> None:
    """Request k of a conversation repeats turns 1..k-1: counts stay exact while earlier pieces are reused."""
    before = counter.cache_stats()["piece_hits"]
    history: list[dict[str, Any]] = []
    for i in range(8):
        history.append(
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: {TEXTS[i % 4]}"}
        )
        if history[-1]["role"] != "user":
            continue
        body = {"messages": list(history)}
        assert count(counter, "chat", body) == count_request(counter.tok, "chat", body)
    if counter.reuse_proven:
        assert counter.cache_stats()["piece_hits"] > before


def test_shared_tokenizers_are_proven(shared_family: str) -> None:
    """Every shared family takes the fast path; a regression to the fallback would be silent otherwise."""
    fc = shared_counter(shared_family)
    assert fc.direct_proven and fc.fallbacks == ()
    assert fc.reuse_proven
    assert fc.render_proven  # plain chats take the compiled-template shortcut


def test_caches_hold_no_text() -> None:
    fc = built_counter("chatml", None)
    secret = "my secret prompt text 8c1f"
    count(fc, "chat", {"messages": [{"role": "user", "content": secret}]})
    keys = fc.cache_keys()
    assert keys
    for key in keys:
        parts = key if isinstance(key, tuple) else (key,)
        assert all(not (isinstance(p, str) and "secret" in p) for p in parts)


def test_cache_is_bounded() -> None:
    fc = FastEncoder(build_tokenizer("chatml"), cache_entries=5)
    for i in range(20):
        body = {"messages": [{"role": "user", "content": f"message number {i}"}]}
        assert count(fc, "chat", body) == count_request(fc.tok, "chat", body)
    stats = fc.cache_stats()
    assert stats["text_entries"] <= 5
    assert stats["piece_entries"] <= 5


def test_split_special_tokens_disables_reuse_but_stays_exact() -> None:
    tok = build_tokenizer("chatml")
    tok.split_special_tokens = True
    fc = FastEncoder(tok)
    assert not fc.reuse_proven
    body = {"messages": turns(3, TEXTS)}
    assert count(fc, "chat", body) == count_request(tok, "chat", body)


def test_a_truncating_call_on_the_shared_backend_never_truncates_a_count() -> None:
    """The fast encoder encodes with the tokenizer's own Rust backend (no 44 MB copy); a transformers call
    with truncation leaves that backend truncating, and a saved tokenizer.json may ship with truncation
    and padding on: counts stay whole and equal to the reference."""
    tok = build_tokenizer("chatml")
    tok.backend_tokenizer.enable_truncation(max_length=3)
    tok.backend_tokenizer.enable_padding(length=64)
    fc = FastEncoder(tok)
    assert fc.direct_proven and fc.reuse_proven
    body = {"messages": turns(3, TEXTS)}
    expected = count_request(tok, "chat", body)
    assert expected.templated is not None and expected.templated > 3
    tok("a b c d e f g h", truncation=True, max_length=2)  # leaves the shared backend truncating at 2
    fc.clear_caches()
    assert count(fc, "chat", body) == expected


def test_single_word_added_token_disables_reuse() -> None:
    from tokenizers import AddedToken

    tok = build_tokenizer("chatml")
    tok.add_tokens([AddedToken("fox", single_word=True)])
    fc = FastEncoder(tok)
    assert not fc.reuse_proven
    body = {"messages": [{"role": "user", "content": "the fox, foxes and a fox."}]}
    assert count(fc, "chat", body) == count_request(tok, "chat", body)


def test_tokenizer_without_rust_backend_falls_back() -> None:
    """No backend_tokenizer (a slow/python tokenizer): every request goes through count_request."""

    class Plain:
        def __init__(self, inner: Any) -> None:
            self._inner = inner
            self.chat_template = inner.chat_template

        def __getattr__(self, name: str) -> Any:
            if name == "backend_tokenizer":
                raise AttributeError(name)
            return getattr(self._inner, name)

        def __call__(self, *a: Any, **k: Any) -> Any:
            return self._inner(*a, **k)

    tok = Plain(build_tokenizer("llama3"))
    fc = FastEncoder(tok)
    assert not fc.direct_proven and not fc.reuse_proven
    assert fc.fallbacks == ()  # no backend is not a fallback: the shortcut never applied
    body = {"messages": turns(3, TEXTS)}
    assert count(fc, "chat", body) == count_request(tok, "chat", body)


ALPHABET = st.sampled_from(
    [
        *"abcXYZ019 .,'!?\n\t",
        "  ",
        "\n\n",
        "é",
        "東",
        "🙂",
        " the",
        "ing",
        "'s",
        *SPECIALS,
        "<s>",
        "</s>",
        "[INST]",
    ]
)
MESSAGE_TEXT = st.lists(ALPHABET, max_size=12).map("".join)
CONVERSATION = st.lists(MESSAGE_TEXT, min_size=1, max_size=6)
HYPO_COUNTERS = [
    ("built-chatml", lambda: built_counter("chatml", None)),
    ("built-llama3", lambda: built_counter("llama3", None)),
]
HYPO_COUNTERS += [(f, lambda f=f: shared_counter(f)) for f in FAMILIES]


@pytest.mark.parametrize("factory", [f for _, f in HYPO_COUNTERS], ids=[i for i, _ in HYPO_COUNTERS])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=CONVERSATION, system=st.one_of(st.none(), MESSAGE_TEXT), gen=st.booleans())
def test_hypothesis_conversations(factory: Any, texts: list[str], system: str | None, gen: bool) -> None:
    fc = factory()
    messages = turns(len(texts), texts)
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    for k in range(1, len(messages) + 1):  # every prefix, in order: the multi-turn reuse path
        body = {"messages": messages[:k], "add_generation_prompt": gen}
        assert count(fc, "chat", body) == count_request(fc.tok, "chat", body)


@pytest.mark.parametrize("k", [1, 2, 5])
def test_direct_render_is_apply_chat_template(counter: FastEncoder, k: int) -> None:
    """The compiled-template shortcut renders exactly the text apply_chat_template renders."""
    for gen in (True, False):
        body = {"messages": turns(k, TEXTS), "add_generation_prompt": gen}
        chat = chat_input(body, counter.parts_format)
        try:
            expected = render_chat(counter.tok, chat)
        except Exception:
            continue  # a template that refuses the shape: nothing to compare
        assert counter.render(chat) == expected


def test_render_shortcut_is_proven_at_load() -> None:
    """A compiled template that renders differently from apply_chat_template is not used."""

    class Skewed:
        """The tokenizer, but its apply_chat_template adds a space: the compiled template transformers
        keeps for it no longer renders what apply_chat_template renders."""

        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        def __call__(self, *a: Any, **k: Any) -> Any:
            return self._inner(*a, **k)

        def apply_chat_template(self, *a: Any, **k: Any) -> Any:
            out = self._inner.apply_chat_template(*a, **k)
            return out + " " if isinstance(out, str) else out

    tok = build_tokenizer("chatml")
    assert FastEncoder(tok).render_proven
    skewed_tok = Skewed(tok)
    messages = turns(3, TEXTS)
    assert render_messages(skewed_tok, messages) != render_messages(tok, messages)
    skewed = FastEncoder(skewed_tok)
    assert not skewed.render_proven
    assert "render_differs" in skewed.fallbacks  # counted by the server (islwatch_fast_path_fallbacks_total)
    body = {"messages": messages}
    assert count(skewed, "chat", body) == count_request(skewed_tok, "chat", body)


def test_best_encoder_falls_back_to_the_reference() -> None:
    """Nothing proven (no Rust backend, no compiled template): the reference encoder itself is used."""

    class Opaque:
        chat_template = None

        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __call__(self, *a: Any, **k: Any) -> Any:
            return self._inner(*a, **k)

    assert type(best_encoder(Opaque(build_tokenizer("chatml")))) is ReferenceEncoder
    assert isinstance(best_encoder(build_tokenizer("chatml")), FastEncoder)


def test_a_proof_that_raises_is_a_recorded_fallback() -> None:
    """A shortcut whose proof raises is turned off and says why (the server counts and logs the reason)."""
    tok = build_tokenizer("chatml")

    class Breaks:
        def __init__(self, inner: Any) -> None:
            self._inner = inner
            self.chat_template = inner.chat_template

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        def __call__(self, *a: Any, **k: Any) -> Any:
            raise RuntimeError("a tokenizer bug")

    broken = Breaks(tok)
    fc = best_encoder(broken)
    assert "direct_raised" in fc.fallbacks and set(fc.fallbacks) <= set(FALLBACK_REASONS)
