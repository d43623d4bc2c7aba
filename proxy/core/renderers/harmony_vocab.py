"""gpt-oss's Harmony encoding, offline: its `o200k_base.tiktoken` derived from the model's own tokenizer.json.

openai_harmony's `load_harmony_encoding(HARMONY_GPT_OSS)` downloads `o200k_base.tiktoken` unless
`TIKTOKEN_ENCODINGS_BASE` names a folder holding it, and refuses a file whose sha256 is not the official
one. islwatch runs air-gapped, so it writes that file from the tokenizer.json it already has (the same
byte-level BPE ranks: the vocabulary's tokens decoded with GPT-2's bytes_to_unicode, the added special
tokens left out, one `base64(bytes) rank` line per token by rank) and checks the hash itself.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from openai_harmony import HarmonyEncodingName, HarmonyError, load_harmony_encoding  # type: ignore[import-untyped]

from ..tokenizer import TokenizerLoadError, _cache_root

VOCAB_FILE = "o200k_base.tiktoken"
# The sha256 openai_harmony checks the file against (the file tiktoken publishes).
VOCAB_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


def _byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: the printable character a byte-level BPE vocab writes per byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def tiktoken_vocab(tokenizer_json: Path, out_dir: Path) -> Path:
    """Write `out_dir/o200k_base.tiktoken` from a byte-level BPE tokenizer.json. Raises TokenizerLoadError when
    the result is not the official file (by sha256): then the tokenizer is not gpt-oss's."""
    try:
        spec = json.loads(tokenizer_json.read_bytes())
        vocab = spec["model"]["vocab"]
        added = {t["id"] for t in spec.get("added_tokens", [])}
        decoder = _byte_decoder()
        lines = [
            base64.b64encode(bytes(decoder[c] for c in token)).decode() + f" {rank}\n"
            for token, rank in sorted(vocab.items(), key=lambda kv: kv[1])
            if rank not in added
        ]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TokenizerLoadError(f"{tokenizer_json} is not a byte-level BPE tokenizer.json") from exc
    data = "".join(lines).encode()
    if hashlib.sha256(data).hexdigest() != VOCAB_SHA256:
        raise TokenizerLoadError(
            f"{tokenizer_json} is not gpt-oss's vocabulary (the o200k_base hash differs)"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / VOCAB_FILE
    tmp = target.with_name(f"{VOCAB_FILE}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, target)  # atomic: a concurrent loader sees the whole file or none
    return target


def vocab_dir(tokenizer_dir: Path) -> Path:
    """The folder under $ISLWATCH_CACHE holding the vocabulary derived from this tokenizer.json, derived on
    first use (keyed by the tokenizer.json's hash; openai_harmony checks the file's own hash at load)."""
    source = tokenizer_dir / "tokenizer.json"
    try:
        key = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    except OSError as exc:
        raise TokenizerLoadError(f"no readable tokenizer.json in {tokenizer_dir}") from exc
    folder = _cache_root() / "harmony" / key
    if not (folder / VOCAB_FILE).is_file():
        try:
            tiktoken_vocab(source, folder)
        except OSError as exc:  # an unwritable cache
            raise TokenizerLoadError(f"cannot write the Harmony vocabulary under {folder}") from exc
    return folder


_ENCODING: Any = None
_LOCK = threading.Lock()


def harmony_encoding(folder: Path) -> Any:
    """The HARMONY_GPT_OSS encoding, loaded once per process from `folder` (every gpt-oss model shares it: the
    vocabulary is pinned by hash). TIKTOKEN_ENCODINGS_BASE is set only while the library loads (it reads
    the variable then) and put back after, so the rest of the process never sees it changed."""
    global _ENCODING
    with _LOCK:
        if _ENCODING is None:
            before = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
            os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(folder)
            try:
                _ENCODING = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
            except HarmonyError as exc:
                raise TokenizerLoadError(f"openai_harmony cannot load {folder / VOCAB_FILE}") from exc
            finally:
                if before is None:
                    del os.environ["TIKTOKEN_ENCODINGS_BASE"]
                else:
                    os.environ["TIKTOKEN_ENCODINGS_BASE"] = before
        return _ENCODING
