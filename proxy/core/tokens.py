"""Render and encode primitives over a transformers tokenizer: the only place islwatch calls
`apply_chat_template` or encodes text, so the counting core, the emulator, the parity gate and the drift
profile all render and encode the same way.

vLLM's chat path is "render to text, then encode" (`vllm/entrypoints/chat_utils.py`
`apply_hf_chat_template` with `tokenize=False`, then the renderer encodes with the request's
`add_special_tokens`, default False). transformers' own `apply_chat_template(tokenize=True)` does the same
(`tokenization_utils_base.py`: it calls the tokenizer with `add_special_tokens=False`), which the parity gate
uses as its reference path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.sandbox
from jinja2 import nodes

from .extract import ChatInput

Messages = list[dict[str, Any]]


def input_ids(encoded: Any) -> list[int]:
    """transformers 5 returns a dict-like BatchEncoding from apply_chat_template(tokenize=True)."""
    if isinstance(encoded, Mapping):
        encoded = encoded["input_ids"]
    elif hasattr(encoded, "input_ids"):
        encoded = encoded.input_ids
    return list(encoded)


def template_of(tok: Any) -> str | None:
    """The chat template a server renders with: the tokenizer's, or its "default" of several named ones."""
    tmpl = getattr(tok, "chat_template", None)
    if isinstance(tmpl, dict):
        return tmpl.get("default")
    return tmpl if isinstance(tmpl, str) else None


def bos_text(tok: Any) -> str | None:
    bos = getattr(tok, "bos_token", None)
    return bos if isinstance(bos, str) and bos else None


@lru_cache(maxsize=64)
def iterates_content_parts(template: str) -> bool:
    """True if the template loops over `message['content']` (vLLM's "openai" content format).

    vLLM decides the same way, by walking the Jinja AST (`_detect_content_format` in chat_utils.py).
    """
    try:
        ast = jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError:
        return False
    for loop in ast.find_all(nodes.For):
        it = loop.iter
        if isinstance(it, nodes.Filter) and it.node is not None:
            it = it.node
        if isinstance(it, nodes.Getitem) and isinstance(it.arg, nodes.Const) and it.arg.value == "content":
            return True
        if isinstance(it, nodes.Getattr) and it.attr == "content":
            return True
    return False


def parts_format(tok: Any) -> bool:
    """Whether messages reach this tokenizer's template as part lists (see `iterates_content_parts`)."""
    template = template_of(tok)
    return template is not None and iterates_content_parts(template)


def developer_role(tok: Any) -> bool:
    """Whether the template knows the `developer` role; vLLM turns developer messages into system messages
    otherwise, deciding by the same substring test (`vllm/renderers/hf.py` `_detect_developer_role_support`)."""
    template = template_of(tok)
    return template is not None and ('"developer"' in template or "'developer'" in template)


@lru_cache(maxsize=64)
def template_variables(template: str) -> frozenset[str]:
    """The variables a template reads: vLLM passes only these of the request's `chat_template_kwargs`
    (`vllm/renderers/hf.py` `resolve_chat_template_kwargs`, via `jinja2.meta.find_undeclared_variables`)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(extensions=[jinja2.ext.loopcontrols])
    env.add_extension(_Generation)
    try:
        return frozenset(jinja2.meta.find_undeclared_variables(env.parse(template)))
    except jinja2.TemplateSyntaxError:
        return frozenset()


class _Generation(jinja2.ext.Extension):
    """transformers' `{% generation %}` block (AssistantTracker), parsed so such templates are readable."""

    tags = {"generation"}  # noqa: RUF012 - jinja2.ext.Extension declares it so

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_noop"), [], [], body).set_lineno(lineno)


def encode(tok: Any, text: str, add_special_tokens: bool) -> list[int]:
    return input_ids(tok(text, add_special_tokens=add_special_tokens))


def encode_len(tok: Any, text: str, add_special_tokens: bool) -> int:
    return len(tok(text, add_special_tokens=add_special_tokens)["input_ids"])


def texts_len(tok: Any, texts: Sequence[str]) -> int:
    """Tokens of several texts encoded separately without special tokens (one batch call)."""
    texts = [t for t in texts if t]
    if not texts:
        return 0
    return sum(len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"])


def _text(rendered: Any) -> str:
    if not isinstance(rendered, str):
        raise TypeError("chat template did not render to text")
    return rendered


def render_messages(
    tok: Any,
    messages: Messages,
    /,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    **template_kwargs: Any,
) -> str:
    """The prompt text the template renders for plain messages (`template_kwargs`: its extra variables)."""
    return _text(
        tok.apply_chat_template(
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tokenize=False,
            **template_kwargs,
        )
    )


def render_chat(tok: Any, chat: ChatInput, /, add_generation_prompt: bool | None = None) -> str:
    """A prepared chat request rendered as vLLM renders it (`add_generation_prompt` overrides the request's).

    Of the request's `chat_template_kwargs` only the variables the template reads are passed (the keys vLLM
    renders by name were merged into the request by extract.py).
    """
    gen = chat.add_generation_prompt if add_generation_prompt is None else add_generation_prompt
    template = template_of(tok) or ""
    read = template_variables(template)
    kwargs = {k: v for k, v in chat.template_kwargs.items() if k in read}
    return _text(
        tok.apply_chat_template(
            chat.messages,
            tools=chat.tools,
            documents=chat.documents,
            add_generation_prompt=gen and not chat.continue_final_message,
            continue_final_message=chat.continue_final_message,
            tokenize=False,
            **kwargs,
        )
    )


def template_ids(
    tok: Any, messages: Messages, add_generation_prompt: bool, continue_final: bool
) -> list[int]:
    """transformers' direct path, `apply_chat_template(tokenize=True)`: the parity gate's reference."""
    return input_ids(
        tok.apply_chat_template(
            messages,
            tokenize=True,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final,
        )
    )
