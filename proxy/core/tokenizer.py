"""Load a tokenizer (hub id, local folder, or a built-in offline vocabulary) and compute its identity.

The identity (template and file hashes, library versions) is what the parity gate pins and what
`islwatch_tokenizer_info` exports, so a silent template or tokenizer change shows up as an alert. The files
hashed are the ones the loaded tokenizer was read from (for `REPO@REV`, the hub snapshot of that revision);
when they cannot be found, the identity says so and hashes the loaded tokenizer's serialised form instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers
import transformers

from .specs import BUILTIN_PREFIX, parse_spec
from .tokens import template_of

log = logging.getLogger("islwatch.tokenizer")

# Files that change what a tokenizer produces; anything else in a hub snapshot is ignored.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tekken.json",
    "preprocessor_config.json",  # the image rule (core/vision.py) reads it: a change is a tokenizer change
)

# The Mistral-7B-Instruct-v0.1 chat template (HF revision 9ab9e76e), the one paired with the
# SentencePiece vocabulary that mistral-common ships as tokenizer.model.v1.
MISTRAL_V01_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user and "
    "assistant roles are supported!') }}{% endif %}{% endfor %}"
)
BUILTINS = {"mistral-v0.1": ("tokenizer.model.v1", MISTRAL_V01_TEMPLATE)}


class TokenizerLoadError(Exception):
    """The tokenizer could not be loaded (missing folder, unknown hub id offline, bad template file)."""


@dataclass(frozen=True)
class TokenizerIdentity:
    name: str
    revision: str | None
    tokenizer_class: str
    template_sha256: str | None
    files: dict[str, str]
    transformers_version: str
    tokenizers_version: str
    # How the server builds the prompt (core/model.py): "jinja", "harmony" or "mistral"; and for jinja the
    # file the chat template came from (core/templates.py), which a processor's template may replace.
    renderer: str = "jinja"
    template_source: str | None = None

    @property
    def tokenizer_sha256(self) -> str:
        """One hash over every tokenizer file, for a single metric label."""
        h = hashlib.sha256()
        for name in sorted(self.files):
            h.update(f"{name}={self.files[name]}\n".encode())
        return h.hexdigest()

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "revision": self.revision,
            "tokenizer_class": self.tokenizer_class,
            "template_sha256": self.template_sha256,
            "tokenizer_sha256": self.tokenizer_sha256,
            "files": dict(self.files),
            "transformers_version": self.transformers_version,
            "tokenizers_version": self.tokenizers_version,
            "renderer": self.renderer,
            "template_source": self.template_source,
        }


@dataclass(frozen=True)
class LoadedTokenizer:
    tokenizer: Any  # a transformers PreTrainedTokenizerBase
    identity: TokenizerIdentity


def sha256_text(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def _cache_root() -> Path:
    return Path(os.environ.get("ISLWATCH_CACHE", Path.home() / ".cache" / "islwatch"))


def materialize_builtin(name: str) -> Path:
    """Write a loadable tokenizer folder for a vocabulary that a pip-installed package ships.

    mistral-common carries the real Mistral v0.1 SentencePiece model; converting it once gives an offline
    default for the demo and the emulator, with no hub access.
    """
    if name not in BUILTINS:
        raise TokenizerLoadError(f"unknown built-in tokenizer {name!r}; known: {', '.join(sorted(BUILTINS))}")
    vocab_file, template = BUILTINS[name]
    try:
        import mistral_common
    except ImportError as exc:  # pragma: no cover - a dependency of islwatch
        raise TokenizerLoadError("built-in tokenizers need the mistral-common package") from exc
    src = Path(mistral_common.__file__).parent / "data" / vocab_file
    target = _cache_root() / "builtin" / f"{name}-{mistral_common.__version__}"
    if (target / "tokenizer_config.json").exists():
        return target
    try:
        return _write_builtin(src, target, template)
    except OSError as exc:  # an unwritable or misplaced cache (ISLWATCH_CACHE a file...): a load error
        raise TokenizerLoadError(
            f"cannot write built-in tokenizer {name!r} under {_cache_root()}: {type(exc).__name__}"
        ) from exc


def _write_builtin(src: Path, target: Path, template: str) -> Path:
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, tmp / "tokenizer.model")
    # No tokenizer.json on purpose: a re-saved conversion drops the legacy SentencePiece handling and
    # encodes "[INST]" after "<s>" without the leading "▁" that mistral-common produces.
    config = {
        "tokenizer_class": "LlamaTokenizer",
        "legacy": True,
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "chat_template": template,
    }
    (tmp / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    try:
        os.replace(tmp, target)
    except OSError:  # another process won the race; its folder is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# The `files` entry when no file could be hashed: the hash of the loaded tokenizer's own serialisation
# (`tokenizers.Tokenizer.to_str()`: vocabulary, merges, normalizer, pre-tokenizer, post-processor, added
# tokens), so the identity still pins what was loaded, and says the files were not hashed.
SERIALISED = "(loaded tokenizer, serialised; files not hashed)"


def _hash_folder(tok: Any, folder: Path) -> dict[str, str]:
    """The tokenizer files in `folder`, plus any other file the tokenizer says it read from there (a
    WordPiece `vocab.txt`, a SentencePiece model under another name: `init_kwargs` holds their paths)."""
    names = set(TOKENIZER_FILES)
    for value in getattr(tok, "init_kwargs", {}).values():
        if isinstance(value, str) and os.path.isfile(value) and os.path.samefile(Path(value).parent, folder):
            names.add(Path(value).name)
    present = [name for name in sorted(names) if (folder / name).is_file()]
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in present}


def _loaded_folder(path_or_id: str, revision: str | None) -> Path:
    """Where from_pretrained read the files: the folder itself, or the hub cache's snapshot of the revision
    it loaded (`local_files_only`: the load just cached them; no network)."""
    if os.path.isdir(path_or_id):
        return Path(path_or_id)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(path_or_id, revision=revision, local_files_only=True))


def file_hashes(tok: Any, path_or_id: str, revision: str | None) -> dict[str, str]:
    """sha256 per file the loaded tokenizer came from; when they cannot be found or read, one entry,
    `SERIALISED`, the hash of the loaded tokenizer itself (logged). Never the hash of nothing."""
    try:
        files = _hash_folder(tok, _loaded_folder(path_or_id, revision))
        reason = "no tokenizer file in its folder"
    except Exception as exc:  # huggingface_hub raises its own errors, OSError, ValueError...: one boundary
        files, reason = {}, type(exc).__name__
    if files:
        return files
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise TokenizerLoadError(
            f"cannot identify tokenizer {path_or_id!r}: files not hashed ({reason}), no backend"
        )
    log.warning(
        "tokenizer %s: files not hashed (%s); its identity is its serialised form", path_or_id, reason
    )
    return {SERIALISED: hashlib.sha256(backend.to_str().encode("utf-8")).hexdigest()}


def load_tokenizer(
    spec: str,
    revision: str | None = None,
    chat_template_file: str | None = None,
    trust_remote_code: bool = False,
) -> LoadedTokenizer:
    """Load by hub id, local folder or `builtin:NAME`; `spec` may carry `@REVISION`."""
    from transformers import AutoTokenizer

    path_or_id, spec_rev = parse_spec(spec)
    revision = revision or spec_rev
    display = path_or_id
    if path_or_id.startswith(BUILTIN_PREFIX):
        path_or_id = str(materialize_builtin(path_or_id[len(BUILTIN_PREFIX) :]))
    try:
        tok = AutoTokenizer.from_pretrained(
            path_or_id, revision=revision, trust_remote_code=trust_remote_code
        )
    except Exception as exc:  # transformers raises OSError, ValueError, ImportError...: one boundary
        raise TokenizerLoadError(f"cannot load tokenizer {spec!r}: {exc.__class__.__name__}: {exc}") from exc
    if chat_template_file:
        try:
            tok.chat_template = Path(chat_template_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenizerLoadError(f"cannot read chat template file {chat_template_file!r}: {exc}") from exc
    template = template_of(tok)
    files = file_hashes(tok, path_or_id, revision)
    if chat_template_file:
        files["chat_template_override"] = sha256_text(template) or ""
    identity = TokenizerIdentity(
        name=display,
        revision=revision,
        tokenizer_class=type(tok).__name__,
        template_sha256=sha256_text(template),
        files=files,
        transformers_version=transformers.__version__,
        tokenizers_version=tokenizers.__version__,
    )
    return LoadedTokenizer(tokenizer=tok, identity=identity)


def load_mistral_identity(folder: Path, file: Path) -> TokenizerIdentity:
    """The identity of a model served through mistral-common: its tokenizer file hashed, no template (the
    request format is mistral-common's own, pinned by its version)."""
    import mistral_common

    return TokenizerIdentity(
        name=str(folder),
        revision=None,
        tokenizer_class=f"MistralTokenizer (mistral-common {mistral_common.__version__})",
        template_sha256=None,
        files={file.name: hashlib.sha256(file.read_bytes()).hexdigest()},
        transformers_version=transformers.__version__,
        tokenizers_version=tokenizers.__version__,
    )
