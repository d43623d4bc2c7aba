"""Serialization parity: does every way of turning a conversation into ids give the ids the model expects?

parity_paths.py computes each serialization path's ids; this module compares every row with its reference,
decides which rows gate the result, and reports where they differ. It never "repairs" ids: a difference is
the finding.

Pure: a tokenizer and conversations in, frozen dataclasses out. The CLI (`islwatch parity`) renders them
(proxy/parity/render.py, proxy/parity/report.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from proxy.core.diagnose import build_profile
from proxy.core.parity_paths import (
    BUILTIN_CONVERSATIONS,
    DIRECT,
    EXTRA_SPECIAL,
    MULTI_TURN_SERVING,
    NEGATIVE_CONTROLS,
    ROWS,
    SERVING_PATHS,
    SPLIT,
    WRONG_ROLE,
    path_ids,
    with_prefill,
)
from proxy.core.probe import first_diff
from proxy.core.tokens import Messages, template_of

# What a row is for: `gate` rows decide pass/fail, `control` rows are negative controls, `info` rows are shown.
RowRole = Literal["gate", "control", "info"]
GATE: RowRole = "gate"
CONTROL: RowRole = "control"
INFO: RowRole = "info"


@dataclass(frozen=True)
class RequestMode:
    """The request flags the paths are computed under (recorded in baselines)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    serving_path: str = SPLIT

    def __post_init__(self) -> None:
        if self.continue_final_message and self.add_generation_prompt:
            # transformers raises the same; a server would reject the request.
            raise ValueError("continue_final_message and add_generation_prompt are mutually exclusive")
        if self.serving_path not in SERVING_PATHS:
            raise ValueError(f"serving path must be one of {', '.join(SERVING_PATHS)}")


@dataclass(frozen=True)
class PathRow:
    """One serialization path of one conversation. Fields are in the order of the JSON report's row
    (report.py adds `tokens`, the row's count, after `reference`)."""

    name: str
    reference: str | None  # the row this one is compared with
    equal: bool | None  # ids == reference ids
    first_diff: int | None  # first position where they differ (the shorter length for a strict prefix)
    special_positions: tuple[int, ...]
    duplicate_bos: bool  # ids start with BOS twice
    role: RowRole
    note: str | None  # why the path does not apply, or the exception class
    ids: tuple[int, ...] | None  # None when the path does not apply or failed

    @property
    def gated(self) -> bool:
        """Part of the pass/fail decision."""
        return self.role == GATE

    @property
    def count(self) -> int | None:
        return None if self.ids is None else len(self.ids)


@dataclass(frozen=True)
class ConversationParity:
    index: int
    messages: Messages
    rows: tuple[PathRow, ...]
    skipped: str | None = None  # the direct path failed on a built-in conversation

    def row(self, name: str) -> PathRow | None:
        return next((r for r in self.rows if r.name == name), None)

    @property
    def ok(self) -> bool:
        if self.skipped is not None:
            return True
        return all(r.equal is True and not r.duplicate_bos for r in self.rows if r.gated)


@dataclass(frozen=True)
class ParityReport:
    mode: RequestMode
    conversations: tuple[ConversationParity, ...]
    plain_special_tokens: int
    template_emits_bos: bool
    controls: tuple[str, ...]  # negative controls that failed to detect anything they should have

    @property
    def checked(self) -> int:
        return sum(1 for c in self.conversations if c.skipped is None)

    @property
    def ok(self) -> bool:
        return self.checked > 0 and not self.controls and all(c.ok for c in self.conversations)


def special_ids(tok: Any) -> frozenset[int]:
    """Every id the tokenizer treats as special: named specials plus added tokens flagged special."""
    out = set(getattr(tok, "all_special_ids", []) or [])
    for tid, added in (getattr(tok, "added_tokens_decoder", {}) or {}).items():
        if getattr(added, "special", False):
            out.add(int(tid))
    return frozenset(out)


def row_role(name: str, mode: RequestMode) -> RowRole:
    """The serving path and its multi-turn history gate; negative controls control; the rest informs."""
    if name in (mode.serving_path, MULTI_TURN_SERVING):
        return GATE
    return CONTROL if name in NEGATIVE_CONTROLS else INFO


def _dup_bos(ids: Sequence[int], bos_id: int | None) -> bool:
    return bos_id is not None and len(ids) >= 2 and ids[0] == bos_id and ids[1] == bos_id


@dataclass(frozen=True)
class _Marks:
    """The tokenizer's special ids and BOS: what every row's ids are marked against."""

    specials: frozenset[int]
    bos_id: int | None

    @classmethod
    def of(cls, tok: Any) -> _Marks:
        return cls(special_ids(tok), getattr(tok, "bos_token_id", None))


def _row(
    name: str,
    ref: str | None,
    ids: list[int] | None,
    ref_ids: list[int] | None,
    role: RowRole,
    note: str | None,
    marks: _Marks,
) -> PathRow:
    equal = at = None
    if ids is not None and ref_ids is not None:
        equal, at = ids == ref_ids, first_diff(ref_ids, ids)
    return PathRow(
        name=name,
        reference=ref,
        equal=equal,
        first_diff=at,
        special_positions=tuple(i for i, t in enumerate(ids or ()) if t in marks.specials),
        duplicate_bos=ids is not None and _dup_bos(ids, marks.bos_id),
        role=role,
        note=note,
        ids=None if ids is None else tuple(ids),
    )


def check_conversation(
    tok: Any, index: int, messages: Messages, mode: RequestMode, skip_on_error: bool
) -> ConversationParity:
    """Every path of one conversation. Errors on the direct path skip (built-ins) or fail (user input)."""
    if mode.continue_final_message:
        messages = with_prefill(messages)
    gen, cont = mode.add_generation_prompt, mode.continue_final_message
    marks = _Marks.of(tok)
    computed: dict[str, list[int] | None] = {}
    rows: list[PathRow] = []
    for name, ref in ROWS:
        try:
            ids, note = path_ids(tok, name, messages, gen, cont, mode.serving_path)
        except Exception as exc:  # a template may reject any path; the row records it, never the run
            reason = f"{type(exc).__name__}: {str(exc)[:120]}"
            ids, note = None, f"error: {reason}"
            if name == DIRECT and skip_on_error:
                return ConversationParity(index, messages, (), skipped=f"template rejects it ({reason})")
        computed[name] = ids
        ref_ids = computed.get(ref) if ref else None
        rows.append(_row(name, ref, ids, ref_ids, row_role(name, mode), note, marks))
    return ConversationParity(index, messages, tuple(rows))


def _blind_controls(convs: Sequence[ConversationParity], plain_specials: int) -> tuple[str, ...]:
    """Negative controls that saw nothing they should have: the gate itself would be blind."""
    blind: list[str] = []
    checked = [c for c in convs if c.skipped is None]
    extra = [c.row(EXTRA_SPECIAL) for c in checked]
    if plain_specials > 0 and any(r is not None and r.equal is True for r in extra):
        blind.append(
            f"{EXTRA_SPECIAL}: the tokenizer adds {plain_specials} special token(s) but ids were equal"
        )
    wrong = [c.row(WRONG_ROLE) for c in checked]
    if any(r is not None and r.equal is True for r in wrong):
        blind.append(f"{WRONG_ROLE}: swapping the generation prompt's role left the ids unchanged")
    return tuple(blind)


def check(
    tok: Any,
    conversations: Sequence[Messages] | None = None,
    mode: RequestMode | None = None,
) -> ParityReport:
    """Parity over `conversations` (the built-in set when None: conversations a template rejects skip)."""
    mode = mode or RequestMode()
    builtin = conversations is None
    convs = tuple(
        check_conversation(tok, i, list(m), mode, skip_on_error=builtin)
        for i, m in enumerate(BUILTIN_CONVERSATIONS if conversations is None else conversations)
    )
    profile = build_profile(tok)
    return ParityReport(
        mode=mode,
        conversations=convs,
        plain_special_tokens=profile.plain_special_tokens,
        template_emits_bos=profile.template_emits_bos,
        controls=_blind_controls(convs, profile.plain_special_tokens),
    )


@dataclass(frozen=True)
class SelfCheck:
    ok: bool
    summary: str  # one line, no prompt text or ids


def _bos_note(report: ParityReport) -> str:
    if not report.plain_special_tokens:
        return "extra special-token pass adds nothing"
    dup = " and duplicates BOS" if report.template_emits_bos else ""
    return f"extra special-token pass adds {report.plain_special_tokens} token(s){dup}"


def _self_check(tok: Any) -> SelfCheck:
    if template_of(tok) is None:
        return SelfCheck(False, "parity not checked: the tokenizer has no chat template (bare counts only)")
    report = check(tok)
    skipped = len(report.conversations) - report.checked
    skip_note = f", {skipped} skipped (template rejects them)" if skipped else ""
    if report.ok:
        return SelfCheck(
            True,
            f"parity ok: direct == split on {report.checked} conversations{skip_note}; {_bos_note(report)}",
        )
    if report.checked == 0:
        return SelfCheck(
            False, f"parity not checked: the template rejected all {skipped} built-in conversations"
        )
    for conv in report.conversations:
        for row in conv.rows:
            if row.gated and row.equal is not True:
                ref = conv.row(row.reference or DIRECT)
                return SelfCheck(
                    False,
                    f"parity FAILED: conversation {conv.index}: {row.name} != {row.reference} at position "
                    f"{row.first_diff} ({row.count} vs {ref.count if ref else None} tokens){skip_note}",
                )
    return SelfCheck(False, f"parity FAILED: negative control blind: {'; '.join(report.controls)}")


def startup_self_check(tok: Any) -> SelfCheck:
    """Direct == split on the built-in conversations, and the extra pass differs where BOS is added.

    Run once when the proxy loads a tokenizer; the summary is one log line with no prompt text.
    Never raises.
    """
    try:
        return _self_check(tok)
    except Exception as exc:  # a startup check must never stop the proxy from serving
        return SelfCheck(False, f"parity self-check error: {type(exc).__name__}")
