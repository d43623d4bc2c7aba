"""Parity baselines: pin a tokenizer's ids and identity, and say exactly what changed since.

A baseline records, per conversation and serialization path, the ids; plus the template text and sha256,
every tokenizer file's sha256, the revision, the library versions and the request-mode flags. Comparing a
fresh run with a baseline lists every change: the first differing template byte, which file, which version,
and for ids the first differing position. The tokenizer's location (`name`) is informational only: moving
a folder changes nothing the model sees; its content is pinned by the file hashes.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict
from pydantic.dataclasses import dataclass

from proxy.core.parity_gate import ParityReport
from proxy.core.probe import first_diff
from proxy.core.tokenizer import LoadedTokenizer, TokenizerIdentity
from proxy.core.tokens import template_of

ChangeKind = Literal["template", "file", "version", "revision", "mode", "conversations", "ids"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass(frozen=True, kw_only=True, config=ConfigDict(extra="forbid"))
class TokenizerRecord(TokenizerIdentity):
    """The tokenizer's identity, validated from a baseline file, plus the template text (so a change can
    be located to the character)."""

    template: str | None


class ModeRecord(_Frozen):
    add_generation_prompt: bool
    continue_final_message: bool
    serving_path: str


class ConversationRecord(_Frozen):
    index: int
    messages_sha256: str
    paths: dict[str, list[int] | None]  # row name -> ids (None: the path does not apply)


class Baseline(_Frozen):
    format: Literal["islwatch-parity-baseline"] = "islwatch-parity-baseline"
    version: Literal[1] = 1
    tokenizer: TokenizerRecord
    mode: ModeRecord
    conversations: list[ConversationRecord]


class Change(_Frozen):
    kind: ChangeKind
    what: str  # the file, version, path... that changed
    detail: str  # content-free description: hashes, positions, ids


def _messages_sha256(messages: object) -> str:
    return hashlib.sha256(orjson.dumps(messages, option=orjson.OPT_SORT_KEYS)).hexdigest()


def baseline_from(loaded: LoadedTokenizer, report: ParityReport) -> Baseline:
    return Baseline(
        tokenizer=TokenizerRecord(**asdict(loaded.identity), template=template_of(loaded.tokenizer)),
        mode=ModeRecord(**asdict(report.mode)),
        conversations=[
            ConversationRecord(
                index=c.index,
                messages_sha256=_messages_sha256(c.messages),
                paths={r.name: None if r.ids is None else list(r.ids) for r in c.rows},
            )
            for c in report.conversations
        ],
    )


def _short(sha: str | None) -> str:
    return "none" if sha is None else sha[:12]


def _template_change(old: TokenizerRecord, new: TokenizerRecord) -> list[Change]:
    if old.template_sha256 == new.template_sha256:
        return []
    detail = f"sha256 {_short(old.template_sha256)} -> {_short(new.template_sha256)}"
    if old.template is not None and new.template is not None:
        at = first_diff(old.template.encode(), new.template.encode())
        if at is not None:
            was = old.template.encode()[max(at - 15, 0) : at + 15]
            now = new.template.encode()[max(at - 15, 0) : at + 15]
            detail += f"; first differing byte {at}: {was!r} -> {now!r}"
    return [Change(kind="template", what="chat template", detail=detail)]


def _file_changes(old: TokenizerRecord, new: TokenizerRecord) -> list[Change]:
    out = []
    for name in sorted(set(old.files) | set(new.files)):
        a, b = old.files.get(name), new.files.get(name)
        if a != b:
            state = "added" if a is None else "removed" if b is None else "changed"
            out.append(Change(kind="file", what=name, detail=f"{state}: sha256 {_short(a)} -> {_short(b)}"))
    return out


def _identity_changes(old: TokenizerRecord, new: TokenizerRecord) -> list[Change]:
    out = _template_change(old, new) + _file_changes(old, new)
    for field in ("transformers_version", "tokenizers_version", "tokenizer_class"):
        a, b = getattr(old, field), getattr(new, field)
        if a != b:
            out.append(Change(kind="version", what=field, detail=f"{a} -> {b}"))
    if old.revision != new.revision:
        out.append(Change(kind="revision", what="revision", detail=f"{old.revision} -> {new.revision}"))
    return out


def _ids_changes(old: ConversationRecord, new: ConversationRecord) -> list[Change]:
    out = []
    for path in sorted(set(old.paths) | set(new.paths)):
        a, b = old.paths.get(path), new.paths.get(path)
        if a == b:
            continue
        where = f"conversation {new.index} {path}"
        if a is None or b is None:
            out.append(
                Change(
                    kind="ids",
                    what=where,
                    detail="path no longer applies" if b is None else "path now applies",
                )
            )
            continue
        at = first_diff(a, b)
        was = a[at] if at is not None and at < len(a) else "end"
        now = b[at] if at is not None and at < len(b) else "end"
        out.append(
            Change(
                kind="ids",
                what=where,
                detail=f"first differing position {at}: {was} -> {now} ({len(a)} -> {len(b)} tokens)",
            )
        )
    return out


def compare(old: Baseline, new: Baseline) -> list[Change]:
    """Every difference between a baseline and a fresh run; empty when nothing the model sees changed."""
    changes = _identity_changes(old.tokenizer, new.tokenizer)
    if old.mode != new.mode:
        changes.append(
            Change(
                kind="mode", what="request mode", detail=f"{old.mode.model_dump()} -> {new.mode.model_dump()}"
            )
        )
    if [c.messages_sha256 for c in old.conversations] != [c.messages_sha256 for c in new.conversations]:
        changes.append(
            Change(
                kind="conversations",
                what="conversations",
                detail=f"the conversation set differs ({len(old.conversations)} -> {len(new.conversations)})",
            )
        )
        return changes  # ids of different conversations are not comparable
    for a, b in zip(old.conversations, new.conversations, strict=True):
        changes.extend(_ids_changes(a, b))
    return changes


def load(data: bytes) -> Baseline:
    """Parse a baseline file's bytes; raises pydantic.ValidationError or orjson.JSONDecodeError."""
    return Baseline.model_validate(orjson.loads(data))


def dump(baseline: Baseline) -> bytes:
    return orjson.dumps(baseline.model_dump(mode="json"), option=orjson.OPT_INDENT_2) + b"\n"
