"""Build a tiny random-weight GGUF around a real tokenizer folder, for a real llama-server to serve.

Only the tokenizer and the chat template matter to the prompt count; the weights are noise (2 layers, hidden
128). Run by scripts/build_tiny_gguf.sh (which keys the cache) in a python with torch and transformers (the
vLLM venv): `python scripts/build_tiny_gguf.py TOKENIZER_DIR ARCH CONVERTER_DIR OUT.gguf`, ARCH `qwen2`, `qwen3`,
`llama` or `gpt_oss`. The Hugging Face model is written to a temporary folder beside the tokenizer files (copied
verbatim), then llama.cpp's own `convert_hf_to_gguf.py` (CONVERTER_DIR, from the llama-cpp-python sdist)
writes the GGUF: its vocabulary, pre-tokenizer and chat template are what llama-server reads. OUT.gguf is
written atomically.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def tiny_model(tok: Any, arch: str) -> Any:
    import transformers

    vocab = max(len(tok), tok.vocab_size)
    vocab += -vocab % 64  # room for every added token, rounded like real checkpoints
    common: dict[str, Any] = dict(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # its own field in both configs (128 / 64 by default): keep it hidden / heads
        max_position_embeddings=8192,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        torch_dtype="float32",
    )
    if arch == "qwen3":
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common, tie_word_embeddings=True))
    if arch == "qwen2":  # Qwen2.5
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common, tie_word_embeddings=True))
    if arch == "llama":  # Llama 3
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, tie_word_embeddings=True))
    if arch == "gpt_oss":
        # Unquantized experts: the converter takes them as plain tensors (conversion/gpt_oss.py warns
        # "is not in MXFP4, performance may be degraded"); MXFP4 blocks are only repacked when present.
        config = transformers.GptOssConfig(
            **common,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=128,
            layer_types=["sliding_attention", "full_attention"],
            tie_word_embeddings=False,
        )
        return transformers.GptOssForCausalLM(config)
    raise SystemExit(f"unknown arch {arch!r} (qwen2, qwen3, llama, gpt_oss)")


def main(argv: list[str]) -> int:
    src, arch, converter, out = Path(argv[0]), argv[1], Path(argv[2]), Path(argv[3])
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src)
    torch.manual_seed(0)
    model = tiny_model(tok, arch)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        hf = Path(tmp) / "hf"
        model.save_pretrained(hf)
        for f in src.iterdir():
            if f.is_file() and f.name != "config.json":
                shutil.copyfile(f, hf / f.name)  # verbatim: the GGUF must carry the real tokenizer
        part = Path(tmp) / "model.gguf"
        cmd = [sys.executable, str(converter / "convert_hf_to_gguf.py"), str(hf)]
        cmd += ["--outfile", str(part), "--outtype", "q8_0"]
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        os.replace(part, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
