"""SGLang's `--reasoning-parser` as a server setting (ServerSettings.reasoning_parser, `--reasoning-parser`,
the proxy config): its Messages API renders past thinking in the parser's own tokens, and drops it without a
parser (core/flavors/sglang_messages.py, proven against SGLang's code in tests/sglang_server). "auto" takes
the parser SGLang's docs give for the template; an operator who starts SGLang otherwise says so."""

from __future__ import annotations

import pytest

from proxy.core.model import load_served_model
from proxy.core.server_settings import REASONING_PARSERS, ServerSettings
from proxy.server.config import ConfigError, load_config
from proxy.server.records import AnalysisSpec
from tests.anthropic_shapes import SHAPES
from tests.conftest import shared_dir

# Ends on a tool result: the rounds' thinking is after the last user turn, where Qwen3's template keeps it.
LOOP = next(s for s in SHAPES if s.name == "agent_loop_5")


def count(parser: str) -> int | None:
    model = load_served_model(str(shared_dir("qwen3")), "sglang", ServerSettings(reasoning_parser=parser))
    return model.count("messages", {**LOOP.body, "model": "m", "max_tokens": 4}).expected_server


def test_the_parser_decides_how_thinking_is_counted() -> None:
    documented, wrapped, dropped = count("auto"), count("qwen3"), count("none")
    assert documented == wrapped  # Qwen3's documented parser
    assert dropped is not None and wrapped is not None and dropped < wrapped


def test_the_setting_reaches_the_workers_and_is_checked() -> None:
    spec = AnalysisSpec.from_json(AnalysisSpec(tokenizers=(), reasoning_parser="none").to_json())
    assert spec.settings().reasoning_parser == "none"
    assert (
        load_config(
            {"upstream": "http://127.0.0.1:8000", "reasoning_parser": "gpt-oss"}, env={}
        ).reasoning_parser
        == "gpt-oss"
    )
    with pytest.raises(ConfigError, match="reasoning_parser"):
        load_config(
            {"upstream": "http://127.0.0.1:8000", "reasoning_parser": "kimi"}, env={}
        )  # not a parser islwatch models
    assert REASONING_PARSERS[0] == "auto"
