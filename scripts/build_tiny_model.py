"""Build a tiny random-weight causal LM around a real tokenizer folder, for a real vLLM server to serve.

Only the tokenizer and the chat template matter to the prompt count; the weights are noise (2 layers,
hidden 128). Runs in the vLLM venv (it has torch): `python scripts/build_tiny_model.py TOKENIZER_DIR OUT_DIR
ARCH` with ARCH `qwen2`, `qwen3` or `llama`: the architecture and config.json `model_type` the server sees.
The tokenizer files are copied verbatim, but for a config.json (deepseek-r1's folder carries one): the
model's own is written. Writes OUT_DIR atomically.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    src, out, arch = Path(argv[0]), Path(argv[1]), argv[2]
    if (out / "config.json").exists():
        return 0
    import torch
    from transformers import (
        AutoTokenizer,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    tok = AutoTokenizer.from_pretrained(src)
    vocab = max(len(tok), tok.vocab_size)
    vocab += -vocab % 64  # room for every added token, rounded like real checkpoints
    common = dict(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif arch == "qwen3":  # head_dim is its own field in Qwen3 (128 by default): keep it hidden / heads
        model = Qwen3ForCausalLM(Qwen3Config(**common, head_dim=32))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise SystemExit(f"unknown arch {arch!r}")
    torch.manual_seed(0)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for f in src.iterdir():
        if f.is_file() and f.name != "config.json":
            shutil.copyfile(f, tmp / f.name)  # verbatim: the server must see the real tokenizer files
    (tmp / "islwatch-tiny.json").write_text(json.dumps({"tokenizer": str(src), "arch": arch}))
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
