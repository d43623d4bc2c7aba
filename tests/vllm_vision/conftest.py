"""Session fixtures: one real vLLM server (CPU build) serving a tiny random-weight Qwen2-VL model, started
once and stopped by pid; one islwatch proxy in front of it.

The server runs with the settings that change image counts: --mm-processor-kwargs '{"max_pixels": 1003520}'
(the model's preprocessor_config.json says 12845056; the flag also keeps vLLM's startup profiling of the
largest image small) and --trust-request-mm-kwargs (per-request limits). vLLM's Qwen2-VL code needs
torchvision: scripts/install_vllm_vision.sh puts a patched copy in a folder of its own, on PYTHONPATH for this
server only.

Skips (with the reason) only when vLLM or that torchvision folder cannot be installed here, or the shared
tokenizers are absent. A server that fails to start is a failure, not a skip.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.core.images import ImageModel
from proxy.core.tokenizer import load_tokenizer
from proxy.core.vision import load_image_model
from tests.conftest import REPO, shared_dir, unavailable
from tests.server.helpers import Background, proxy_config
from tests.vllm_server.vllm_proc import (
    VllmServer,
    VllmUnavailable,
    find_python,
    free_port,
    installed,
    stop,
    vllm_version,
    wait_healthy,
)

INSTALL_VISION = REPO / "scripts" / "install_vllm_vision.sh"
BUILD_VL_MODEL = REPO / "scripts" / "build_tiny_vl_model.py"
ENV_VISION_PATH = "ISLWATCH_VLLM_VISION_PATH"
TOKENIZER_FAMILY = "qwen2.5-instruct"  # its vocabulary carries Qwen2-VL's vision tokens
ARCH = "qwen2_vl"
SERVER_MM_KWARGS = {"max_pixels": 1003520}  # 1280 * 28 * 28: Qwen2-VL's documented "max_pixels" example
MAX_MODEL_LEN = 8192


def vision_path(python: str) -> str:
    """$ISLWATCH_VLLM_VISION_PATH, else the install script."""
    return installed(
        INSTALL_VISION,
        ENV_VISION_PATH,
        os.path.isdir,
        lambda tail: VllmUnavailable(f"torchvision for vLLM's Qwen2-VL could not be installed: {tail}"),
        env={**os.environ, "ISLWATCH_VLLM_PYTHON": python},
    )


def tiny_vl_model(python: str, tokenizer_dir: Path) -> Path:
    """Built once, keyed by the tokenizer files and the build script (template, processor config)."""
    digest = hashlib.sha256(BUILD_VL_MODEL.read_bytes())
    for f in sorted(tokenizer_dir.iterdir()):
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    out = Path(python).parents[1] / "tiny-models" / f"{ARCH}-{digest.hexdigest()[:12]}"  # in the venv
    subprocess.run([python, str(BUILD_VL_MODEL), str(tokenizer_dir), str(out), ARCH], check=True)
    return out


def launch_vision(python: str, server: VllmServer, torchvision: str) -> subprocess.Popen[bytes]:
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", server.model]
    cmd += ["--host", "127.0.0.1", "--port", str(server.port), "--enforce-eager", "--dtype", "float32"]
    cmd += ["--max-model-len", str(MAX_MODEL_LEN), "--disable-log-stats"]
    cmd += ["--limit-mm-per-prompt", json.dumps({"image": 2})]
    cmd += ["--mm-processor-kwargs", json.dumps(SERVER_MM_KWARGS), "--trust-request-mm-kwargs"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env["PYTHONPATH"] = torchvision  # the patched torchvision, for this server only
    log = open(server.log_path, "wb")  # noqa: SIM115 - the child owns the handle for its lifetime
    return subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
    )


@pytest.fixture(scope="session")
def vision_python() -> tuple[str, str]:
    """(the vLLM venv's python, the torchvision folder)."""
    try:
        python = find_python()
        return python, vision_path(python)
    except VllmUnavailable as exc:
        unavailable(str(exc))


@pytest.fixture(scope="session")
def vl_server(
    vision_python: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    tokenizer_dir = shared_dir(TOKENIZER_FAMILY)  # a skip when not built, a failure under CI
    python, torchvision = vision_python
    model = tiny_vl_model(python, tokenizer_dir)
    log = tmp_path_factory.mktemp("vllm-vision") / "qwen2-vl.log"
    server = VllmServer(ARCH, model, free_port(), log, vllm_version(python))
    proc = launch_vision(python, server, torchvision)
    try:
        wait_healthy(proc, server)
        yield server
    finally:
        stop(proc)


@pytest.fixture(scope="session")
def vl_tok(vl_server: VllmServer) -> Any:
    """islwatch's tokenizer for the model: the served folder itself (tokenizer files, preprocessor config)."""
    return load_tokenizer(vl_server.model).tokenizer


@pytest.fixture(scope="session")
def vl_images(vl_tok: Any) -> ImageModel:
    model = load_image_model(vl_tok, SERVER_MM_KWARGS, trust_request_kwargs=True)
    assert model is not None, "the tiny Qwen2-VL folder has no image rule"
    return model


@pytest.fixture(scope="session")
def vl_proxy(vl_server: VllmServer) -> Iterator[tuple[str, str]]:
    """An islwatch proxy (default vllm flavor, analysis in a worker process) configured as the server is."""
    from proxy.server.app import run_proxy

    cfg = proxy_config(
        vl_server.base_url,
        tokenizer="none",
        model_tokenizers={vl_server.model: vl_server.model},
        mm_processor_kwargs=SERVER_MM_KWARGS,
        trust_request_mm_kwargs=True,
        analysis_mode="process",
    )
    bg = Background()
    try:
        url, admin_url, _ = bg.enter(run_proxy(cfg))
        yield url, admin_url
    finally:
        bg.close()
