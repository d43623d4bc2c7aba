"""Which chat template a server renders a request with, and the file it came from. Pure but for reading the
model folder's files.

vLLM 0.32 (`vllm/renderers/hf.py` `resolve_chat_template`) takes, in order:
1. the server's `--chat-template` (islwatch: the `chat_template` setting);
2. the *processor's* template (`AutoProcessor`, when the folder has a processor), unless the request has tools;
3. the tokenizer's (`get_chat_template`: of several named templates, `tool_use` when there are tools, else
   `default`).
A multimodal folder (Qwen2-VL, Gemma 3 and their fine-tunes) often ships the text template in
`tokenizer_config.json` and the vision one in `chat_template.json`: the server renders images with the second.

The processor's template is read as transformers 5 reads it (`processing_utils.py`
`ProcessorMixin.get_processor_dict`): the legacy `chat_template.json` (`{"chat_template": ...}`), else
`chat_template.jinja`, else `processor_config.json`'s `chat_template`. A folder has a processor (AutoProcessor
returns a `ProcessorMixin`, not the tokenizer) when it holds a `processor_config.json` or a
`preprocessor_config.json`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
OVERRIDE = "--chat-template"


@dataclass(frozen=True)
class Template:
    text: str
    source: str  # the file it came from (or OVERRIDE)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def processor_template(folder: Path) -> Template | None:
    """The template AutoProcessor would carry for this folder, None when it has no processor."""
    if not any((folder / name).is_file() for name in PROCESSOR_FILES):
        return None
    legacy = _read_json(folder / "chat_template.json")
    if isinstance(legacy, dict) and isinstance(legacy.get("chat_template"), str):
        return Template(legacy["chat_template"], "chat_template.json")
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return Template(jinja.read_text(encoding="utf-8"), "chat_template.jinja")
    config = _read_json(folder / "processor_config.json")
    if isinstance(config, dict) and isinstance(config.get("chat_template"), str):
        return Template(config["chat_template"], "processor_config.json")
    return None


def tokenizer_template_source(folder: Path | None, overridden: bool) -> str | None:
    """Where the tokenizer's own template was read from (transformers 5 prefers `chat_template.jinja`)."""
    if overridden:
        return OVERRIDE
    if folder is None:
        return None
    if (folder / "chat_template.jinja").is_file():
        return "chat_template.jinja"
    config = _read_json(folder / "tokenizer_config.json")
    if isinstance(config, dict) and config.get("chat_template") is not None:
        return "tokenizer_config.json"
    return None


def has_tools(body: Any) -> bool:
    """Whether vLLM renders this request with tools (`tool_dicts is not None`: the request's `tools` field)."""
    return isinstance(body, dict) and body.get("tools") is not None
