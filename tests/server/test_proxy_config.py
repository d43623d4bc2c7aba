"""Configuration: flags over environment over YAML over defaults, and clear errors with exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from proxy.server.config import ConfigError, load_config, parse_model_tokenizers
from proxy.server.records import DEFAULT_LABEL, OTHER_LABEL, route_model


def test_precedence_flags_env_yaml_defaults(tmp_path) -> None:
    cfg_file = tmp_path / "islwatch.yaml"
    cfg_file.write_text(
        "upstream: http://yaml:8000\nlisten: 0.0.0.0:7000\nanalysis-workers: 3\n"
        "model_tokenizers:\n  llama: /models/llama@abc\n"
    )
    env = {
        "ISLWATCH_LISTEN": "127.0.0.1:7100",
        "ISLWATCH_INJECT_STREAM_USAGE": "true",
        "ISLWATCH_DUMP_MAX": "5",
    }
    cfg = load_config({"analysis_workers": 2, "listen": None}, str(cfg_file), env)
    assert cfg.upstream == "http://yaml:8000"  # YAML
    assert cfg.listen == "127.0.0.1:7100"  # env over YAML (the flag was not given)
    assert cfg.analysis_workers == 2  # flag over YAML
    assert cfg.inject_stream_usage is True and cfg.dump_max == 5
    assert cfg.model_tokenizers == {"llama": "/models/llama@abc"}
    assert cfg.admin == "127.0.0.1:9100" and cfg.max_body_bytes == 8 * 1024 * 1024  # defaults
    assert cfg.tokenizer == "builtin:mistral-v0.1" and cfg.analysis_mode == "process"


def test_config_file_from_env_and_model_map_from_env(tmp_path) -> None:
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("upstream: http://u:1\n")
    env = {"ISLWATCH_CONFIG": str(cfg_file), "ISLWATCH_MODEL_TOKENIZERS": "a=x@1, b=y"}
    cfg = load_config({}, None, env)
    assert cfg.upstream == "http://u:1" and cfg.model_tokenizers == {"a": "x@1", "b": "y"}


@pytest.mark.parametrize(
    ("flags", "env", "needle"),
    [
        ({}, {}, "upstream: required"),
        ({"upstream": "ftp://x"}, {}, "http(s) URL"),
        ({"upstream": "http://x", "listen": "nope"}, {}, "listen must be HOST:PORT"),
        ({"upstream": "http://x"}, {"ISLWATCH_MAX_BODY_BYTES": "-1"}, "max_body_bytes"),
        ({"upstream": "http://x"}, {"ISLWATCH_ANALYSIS_MODE": "fork"}, "(from environment)"),
    ],
)
def test_errors_name_the_key_and_the_source(flags, env, needle) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(flags, None, env)
    assert needle in str(info.value)


def test_unknown_yaml_key_and_bad_yaml(tmp_path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("upstream: http://x\nupstream_url: typo\n")
    with pytest.raises(ConfigError, match="upstream_url: unknown key"):
        load_config({}, str(f), {})
    f.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config({}, str(f), {})
    with pytest.raises(ConfigError, match="config file"):
        load_config({}, str(tmp_path / "missing.yaml"), {})


def test_model_tokenizer_items() -> None:
    assert parse_model_tokenizers(["m=/p@rev", "n = builtin:mistral-v0.1"]) == {
        "m": "/p@rev",
        "n": "builtin:mistral-v0.1",
    }
    with pytest.raises(ConfigError):
        parse_model_tokenizers(["no-equals"])


def test_model_routing_labels_are_bounded() -> None:
    assert route_model("anything", frozenset(), True) == route_model("else", frozenset(), True)
    assert route_model("anything", frozenset(), True).label == DEFAULT_LABEL
    known = frozenset({"llama"})
    assert route_model("llama", known, True).label == "llama"
    unknown = {route_model(f"model-{i}", known, True) for i in range(50)} | {route_model(None, known, True)}
    assert {(r.label, r.unknown) for r in unknown} == {(OTHER_LABEL, True)}
    assert route_model("x", known, False).tokenizer_key is None  # no default tokenizer: not analysed


def test_cli_exits_2_with_a_clear_message() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "proxy", "--listen", "bad"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
    )
    assert out.returncode == 2
    assert "upstream: required" in out.stderr and "listen must be HOST:PORT" in out.stderr


def test_server_settings_from_yaml_env_and_flags(tmp_path) -> None:
    """The server's own start-up settings reach the analysis spec the workers load from (JSON), as vLLM's
    flags take them: a JSON object for --default-chat-template-kwargs, a date, a tokenizer mode."""
    from proxy.server.app import analysis_spec
    from proxy.server.records import AnalysisSpec

    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("upstream: http://u:1\ndefault_chat_template_kwargs:\n  enable_thinking: false\n")
    env = {"ISLWATCH_HARMONY_START_DATE": "2026-01-31", "ISLWATCH_TOKENIZER_MODE": "mistral"}
    cfg = load_config({}, str(cfg_file), env)
    settings = AnalysisSpec.from_json(analysis_spec(cfg).to_json()).settings()
    assert settings.default_chat_template_kwargs == {"enable_thinking": False}
    assert settings.harmony_start_date == "2026-01-31" and settings.tokenizer_mode == "mistral"
    flagged = load_config({"upstream": "http://u:1", "default_chat_template_kwargs": '{"a": 1}'}, None, {})
    assert flagged.default_chat_template_kwargs == {"a": 1}
    for bad in ({"default_chat_template_kwargs": "[1]"}, {"harmony_start_date": "today"}):
        with pytest.raises(ConfigError) as info:
            load_config({"upstream": "http://u:1", **bad}, None, {})
        assert next(iter(bad)) in str(info.value)
