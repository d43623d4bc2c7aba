"""Build a tiny random-weight Qwen2-VL (or Qwen2.5-VL) model around the Qwen2.5 tokenizer, for a real vLLM
server to serve images (tests/vllm_vision).

Only the tokenizer, the chat template and the image processor config matter to the prompt count; the
weights are noise (text: 2 layers, hidden 128, `mrope_section` [8, 12, 12]; vision: depth 2, width 64,
output 128). The Qwen2.5 tokenizer files already carry `<|vision_start|>`, `<|vision_end|>`,
`<|image_pad|>` and `<|video_pad|>` (ids 151652, 151653, 151655, 151656, the ids Qwen2VLConfig defaults to);
the chat template is Qwen2-VL-2B-Instruct's, the `preprocessor_config.json` that model's (patch 14, merge 2,
temporal patch 2, min_pixels 3136, max_pixels 12845056).

Runs in the vLLM venv (it has torch): `python scripts/build_tiny_vl_model.py TOKENIZER_DIR OUT_DIR ARCH` with
ARCH `qwen2_vl` or `qwen2_5_vl`. Writes OUT_DIR atomically; an existing OUT_DIR is kept.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

# Qwen/Qwen2-VL-2B-Instruct tokenizer_config.json `chat_template` (the same text is quoted in llama.cpp's
# tests/test-chat-template.cpp as "Qwen2-VL-2B-Instruct (tokenizer_config.json)").
QWEN2_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PROCESSOR_CLASSES = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor"}


def preprocessor_config(arch: str) -> dict[str, object]:
    """Qwen/Qwen2-VL-2B-Instruct's preprocessor_config.json (Qwen2.5-VL's differs only in processor_class)."""
    return {
        "min_pixels": 3136,
        "max_pixels": 12845056,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": PROCESSOR_CLASSES[arch],
    }


def build_model(arch: str, vocab: int, bos: int | None, eos: int | None) -> object:
    import transformers

    text = dict(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim 64: vLLM's MRotaryEmbedding needs sum(mrope_section) == head_dim / 2
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "mrope_section": [8, 12, 12], "rope_theta": 1000000.0},
        bos_token_id=bos,
        eos_token_id=eos,
    )
    vision: dict[str, object] = dict(depth=2, num_heads=4, patch_size=14, spatial_merge_size=2)
    if arch == "qwen2_vl":
        vision.update(embed_dim=64, hidden_size=128, mlp_ratio=2)
        config = transformers.Qwen2VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True)
        return transformers.Qwen2VLForConditionalGeneration(config)
    if arch == "qwen2_5_vl":
        vision.update(hidden_size=64, intermediate_size=128, out_hidden_size=128, fullatt_block_indexes=[1])
        config = transformers.Qwen2_5_VLConfig(
            text_config=text, vision_config=vision, tie_word_embeddings=True
        )
        return transformers.Qwen2_5_VLForConditionalGeneration(config)
    raise SystemExit(f"unknown arch {arch!r}")


def main(argv: list[str]) -> int:
    src, out, arch = Path(argv[0]), Path(argv[1]), argv[2]
    if (out / "config.json").exists():
        return 0
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src)
    vocab = max(len(tok), tok.vocab_size)
    vocab += -vocab % 64  # room for every added token, rounded like real checkpoints
    torch.manual_seed(0)
    model = build_model(arch, vocab, tok.bos_token_id, tok.eos_token_id)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)  # type: ignore[attr-defined]
    write_processor_files(src, tmp, arch)
    (tmp / "islwatch-tiny.json").write_text(json.dumps({"tokenizer": str(src), "arch": arch}))
    os.replace(tmp, out)
    return 0


def write_processor_files(src: Path, dst: Path, arch: str) -> None:
    """The tokenizer files (copied verbatim but for the chat template) and the image processor config: all
    islwatch reads of the model (tests/core builds this folder without torch)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file():
            shutil.copyfile(f, dst / f.name)
    tok_config = json.loads((dst / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = QWEN2_VL_TEMPLATE
    (dst / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2, ensure_ascii=False))
    (dst / "preprocessor_config.json").write_text(json.dumps(preprocessor_config(arch), indent=2))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
