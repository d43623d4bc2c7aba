"""Small real tokenizers that tests build themselves with the `tokenizers` library (no download).

A byte-level BPE trained on a tiny corpus, wrapped in PreTrainedTokenizerFast, with one of four chat
template styles seen in the wild. Training is deterministic and takes well under a second.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIALS = [
    "<|bos|>",
    "<|eos|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "[INST]",
    "[/INST]",
    "<unk>",
]

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? Paris is the capital of France.",
    "Hello! How are you today? I am fine, thank you.",
    "def main():\n    return 42\n",
    "Unicode: café, naïve, 東京, 🙂, Ελληνικά.",
    "system user assistant tool function arguments name content",
    "You are a helpful assistant. Answer briefly and precisely.",
] * 20

# ChatML with a default system prompt (Qwen / SmolLM style).
CHATML = (
    "{%- if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Llama-3 style headers; BOS comes from the template itself.
LLAMA3 = (
    "{{ bos_token }}{%- for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# [INST] style that rejects a system role and requires alternation (Mistral v0.1 style).
INST = (
    "{{ bos_token }}{%- for m in messages %}"
    "{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}"
    "{%- if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{%- elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}"
    "{%- else %}{{ raise_exception('Only user and assistant roles are supported!') }}{%- endif %}"
    "{%- endfor %}"
)
# Iterates over content parts (multimodal style): vLLM passes the part list through.
PARTS = (
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{%- if m['content'] is string %}{{ m['content'] }}"
    "{%- else %}{%- for p in m['content'] %}{%- if p['type'] == 'text' %}{{ p['text'] }}"
    "{%- elif p['type'] == 'image' %}<|bos|>{%- endif %}{%- endfor %}{%- endif %}"
    "<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEMPLATES = {"chatml": CHATML, "llama3": LLAMA3, "inst": INST, "parts": PARTS}


@lru_cache(maxsize=1)
def _trained() -> str:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok.to_str()


def build_tokenizer(style: str, add_bos: bool | None = None) -> Any:
    """A fresh PreTrainedTokenizerFast with the named template; `add_bos` adds a BOS post-processor."""
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer.from_str(_trained())
    if add_bos if add_bos is not None else style in ("llama3", "inst"):
        bos_id = raw.token_to_id("<|bos|>")
        raw.post_processor = processors.TemplateProcessing(
            single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", bos_id)]
        )
    eos = {"chatml": "<|im_end|>", "parts": "<|im_end|>", "llama3": "<|eot_id|>", "inst": "<|eos|>"}[style]
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<|bos|>", eos_token=eos, unk_token="<unk>")
    tok.chat_template = TEMPLATES[style]
    return tok


def save_tokenizer(style: str, folder: str, add_bos: bool | None = None) -> str:
    build_tokenizer(style, add_bos).save_pretrained(folder)
    return folder
