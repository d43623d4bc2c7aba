"""vLLM 0.32's own request preprocessing in long-lived subprocesses (vllm_oracle.py beside this, run with the
vLLM venv's python from scripts/install_vllm.sh), and the model folders they read.

Families share processes: each process pays vLLM's imports once (~25 s of CPU, ~600 MB) and then ~30 s and
~200 MB per folder (measured: all 14 families in one process, 3.5 GB; one process each, ~1.2 GB apiece,
17 GB). The conftest starts a few at once (ISLWATCH_VLLM_ORACLES, default 2: one per core here); each
family keeps its own folder, flags and server state in the process. Sharing changes no answer: checked once,
qwen3, gpt-oss and Mistral Nemo alone and in one process with Gemma 3 answered all 90 shapes with the same
ids and errors (270 of 270).

No engine runs, so no weights are needed: a family's folder is a config.json with the family's real
`model_type` and architecture (what picks vLLM's renderer and transformers' tokenizer class) beside the
shared tokenizer files, linked, never copied into the repo. The two Mistral folders are built from the
files mistral-common ships (`tekken.json` or `tokenizer.model.v7`, `params.json`, a tensorless
`consolidated.safetensors`): with those, vLLM picks its `mistral` tokenizer mode and renders with
mistral-common (vllm/tokenizers/registry.py `resolve_tokenizer_args`). Folders are cached next to the venv,
keyed by their content.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.oracle_pipe import OraclePipe, spawn_oracle

ORACLE = Path(__file__).with_name("vllm_oracle.py")
# Guards against a hung child, not timing assertions: imports, then each folder (~30 s on an idle core).
READY_DEADLINE_SECONDS = 300.0
READY_DEADLINE_PER_FOLDER_SECONDS = 120.0
ANSWER_DEADLINE_SECONDS = 120.0
CONTEXT = 131072  # every folder's max_position_embeddings: long agent loops fit, as on the real models
TOOLS = ["--enable-auto-tool-choice", "--tool-call-parser"]


@dataclass(frozen=True)
class Family:
    """How a family's folder looks and how it is served: `vllm serve` flags as a deployment would pass them
    (a tool-call parser, so that `tool_choice` auto/required/named is accepted; the model's reasoning
    parser where vLLM has one)."""

    config: dict[str, Any]
    serve: tuple[str, ...]
    mistral_file: str | None = (
        None  # a file in mistral-common's data folder: a `mistral` tokenizer mode folder
    )
    mistral_name: str = ""  # the name vLLM looks for: tekken.json or tokenizer.model.v7


def hf(model_type: str, arch: str, vocab: int, *serve: str) -> Family:
    config = {"architectures": [arch], "model_type": model_type, "vocab_size": vocab}
    return Family({**config, "max_position_embeddings": CONTEXT}, tuple(serve))


def mistral(source: str, name: str, vocab: int, *serve: str) -> Family:
    # The real checkpoints' params.json, made small (no weights are read); max_position_embeddings set so
    # vLLM does not look for a Hugging Face config (transformers_utils/config.py MistralConfigParser).
    params = {
        "dim": 128,
        "n_layers": 2,
        "head_dim": 32,
        "hidden_dim": 256,
        "n_heads": 4,
        "n_kv_heads": 2,
        "rope_theta": 1000000.0,
        "norm_eps": 1e-05,
        "vocab_size": vocab,
        "max_position_embeddings": CONTEXT,
    }
    return Family(params, tuple(serve), source, name)


# Family -> folder and flags. Real model types and architectures (the vocabulary sizes of the real
# checkpoints); Gemma 3 as the 1B instruct checkpoint's text-only `gemma3_text` (the larger ones are
# Gemma3ForConditionalGeneration and need an image processor folder).
FAMILIES: dict[str, Family] = {
    "mistral-7b-instruct-v0.1": hf("mistral", "MistralForCausalLM", 32000, *TOOLS, "pythonic"),
    "qwen2.5-instruct": hf("qwen2", "Qwen2ForCausalLM", 152064, *TOOLS, "hermes"),
    "llama-3-8b-instruct": hf("llama", "LlamaForCausalLM", 128256, *TOOLS, "pythonic"),
    "phi-3-mini-4k-instruct": hf("phi3", "Phi3ForCausalLM", 32064, *TOOLS, "pythonic"),
    "tinyllama-1.1b-chat-v1.0": hf("llama", "LlamaForCausalLM", 32000, *TOOLS, "pythonic"),
    "smollm2-135m-instruct": hf("llama", "LlamaForCausalLM", 49152, *TOOLS, "pythonic"),
    "deepseek-v3": hf("deepseek_v3", "DeepseekV3ForCausalLM", 129280, *TOOLS, "deepseek_v3"),
    "qwen3": hf("qwen3", "Qwen3ForCausalLM", 151936, *TOOLS, "hermes", "--reasoning-parser", "qwen3"),
    "llama-3.1": hf("llama", "LlamaForCausalLM", 128256, *TOOLS, "llama3_json"),
    "gemma-3": hf("gemma3_text", "Gemma3ForCausalLM", 262144, *TOOLS, "pythonic"),
    # gpt-oss: the Harmony path (the OnlineRenderer's use_harmony); vLLM defaults its reasoning parser.
    "gpt-oss": hf("gpt_oss", "GptOssForCausalLM", 201088, *TOOLS, "openai"),
    "deepseek-r1": hf(
        "deepseek_v3",
        "DeepseekV3ForCausalLM",
        129280,
        *TOOLS,
        "deepseek_v3",
        "--reasoning-parser",
        "deepseek_r1",
    ),
    "mistral-nemo": mistral("tekken_240718.json", "tekken.json", 131072, *TOOLS, "mistral"),
    "mistral-large-2411": mistral(
        "mistral_instruct_tokenizer_241114.model.v7", "tokenizer.model.v7", 32768, *TOOLS, "mistral"
    ),
}


def mistral_common_data() -> Path:
    import mistral_common

    return Path(mistral_common.__file__).parent / "data"


def _sources(family: str, shared: Path) -> dict[str, Path]:
    """The files a family's folder links to: name in the folder -> file."""
    spec = FAMILIES[family]
    if spec.mistral_file is not None:
        return {spec.mistral_name: mistral_common_data() / spec.mistral_file}
    folder = shared / family
    return {f.name: f for f in sorted(folder.iterdir()) if f.is_file() and f.name != "config.json"}


def _digest(parts: list[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()[:12]


# A safetensors file with no tensors: an 8-byte little-endian header length, then the JSON header.
EMPTY_SAFETENSORS = len(b"{}").to_bytes(8, "little") + b"{}"


def model_folder(cache: Path, family: str, shared: Path) -> Path:
    """The folder vLLM and islwatch both load for `family`, built once (keyed by its files' content)."""
    spec = FAMILIES[family]
    sources = _sources(family, shared)
    config_name = "params.json" if spec.mistral_file is not None else "config.json"
    config = json.dumps(spec.config, indent=2, sort_keys=True).encode()
    key = [config, *(name.encode() + b"\0" + path.read_bytes() for name, path in sources.items())]
    out = cache / f"{family}-{_digest(key)}"
    if out.is_dir():
        return out
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    tmp.mkdir(parents=True)
    (tmp / config_name).write_bytes(config)
    for name, path in sources.items():
        (tmp / name).symlink_to(path.resolve())
    if spec.mistral_file is not None:
        (tmp / "consolidated.safetensors").write_bytes(EMPTY_SAFETENSORS)
    os.replace(tmp, out)
    return out


@dataclass
class OracleProcess:
    """One oracle subprocess serving one or more families' folders."""

    folders: dict[str, Path]  # family -> model folder
    pipe: OraclePipe
    version: str = ""
    started: float = field(default_factory=time.monotonic)
    ready_seconds: float = 0.0  # reported at the end of the run (conftest), never asserted
    seconds: dict[str, float] = field(default_factory=dict)  # the oracle's own: imports, each folder's build

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.pipe.proc

    def wait_ready(self) -> None:
        budget = READY_DEADLINE_SECONDS + READY_DEADLINE_PER_FOLDER_SECONDS * len(self.folders)
        ready = self.pipe.ready(self.started + budget)
        self.version = str(ready["version"])
        self.seconds = dict(ready.get("seconds", {}))
        self.ready_seconds = time.monotonic() - self.started

    def ask(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.pipe.ask({"endpoint": endpoint, "body": body}, ANSWER_DEADLINE_SECONDS)


@dataclass
class Oracle:
    """One family's server, as its requests see it: its folder is the model name they carry."""

    family: str
    model_dir: Path
    process: OracleProcess
    answer_seconds: list[float] = field(default_factory=list)  # reported, never asserted

    @property
    def version(self) -> str:
        return self.process.version

    @property
    def build_seconds(self) -> float:
        return self.process.seconds.get(str(self.model_dir), 0.0)

    def answer(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        """{"status": 200, "input_ids": [...], "prompts": [[...]]} or {"status": 400 | 500 | ..., "error":
        ...}, as vLLM answers the request for this family's model."""
        sent = time.monotonic()
        answer = self.process.ask(endpoint, {**body, "model": str(self.model_dir)})
        self.answer_seconds.append(time.monotonic() - sent)
        return answer


def launch(python: str, folders: dict[str, Path], log_path: Path, env: dict[str, str]) -> OracleProcess:
    """One oracle process for these families' folders, each with its family's `vllm serve` flags."""
    argv: list[str] = []
    for family, folder in folders.items():
        argv += [*(["--and"] if argv else []), str(folder), *FAMILIES[family].serve]
    pipe = spawn_oracle(
        "the vLLM oracle", [python, str(ORACLE), *argv], log_path, {**env, "VLLM_TARGET_DEVICE": "cpu"}
    )
    return OracleProcess(dict(folders), pipe)


def stop(process: OracleProcess) -> None:
    """By pid, with its process group."""
    process.pipe.stop()
