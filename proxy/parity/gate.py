"""Serialization parity: does every way of turning a conversation into ids give the ids the model expects?

The reference is the direct path, `apply_chat_template(tokenize=True)`, which is what vLLM and SGLang feed
the model for chat requests. A serving adapter usually takes the split path instead: render the template to
text, then encode it. The split path is only equal when the encode adds no special tokens
(`add_special_tokens=False`): the template already wrote BOS, and a second pass writes it again (vLLM
documents this for its `add_special_tokens` chat extension). This module computes each path's ids and
reports where they differ. It never "repairs" ids: a difference is the finding.

Pure: a tokenizer and conversations in, frozen dataclasses out. The CLI (`parity_cmd`) renders them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.diagnose import build_profile
from proxy.core.tokens import input_ids, template_of

Messages = list[dict[str, Any]]

# Row names, in table order. `split` is what a correct adapter does; `extra-special` and `wrong-role` are
# negative controls (they must differ from direct where the tokenizer adds BOS / has a generation prompt).
DIRECT = "direct"
SPLIT = "split"
EXTRA_SPECIAL = "extra-special"
GEN_OFF = "gen-off"
PREFILL_CONTINUED = "prefill-continued"
PREFILL_CLOSED = "prefill-closed"
WRONG_ROLE = "wrong-role"
MULTI_TURN = "multi-turn"
MULTI_TURN_SERVING = "multi-turn-serving"
# What `--serving-path` may claim the adapter does; the gate compares it with direct.
SERVING_PATHS = (SPLIT, EXTRA_SPECIAL, GEN_OFF, WRONG_ROLE)
NEGATIVE_CONTROLS = (EXTRA_SPECIAL, WRONG_ROLE)

BUILTIN_CONVERSATIONS: tuple[Messages, ...] = (
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "user", "content": "Hello! What is 2+2?"},
        {"role": "assistant", "content": "2+2 equals 4."},
        {"role": "user", "content": "Thanks. Now say it in French."},
    ],
    # Whitespace and non-ASCII at the edges are where a re-encode merges differently.
    [{"role": "user", "content": "  Leading spaces, café, 東京 🙂\n\nand a blank line.  "}],
    # Templates that reject a system role (Mistral v0.1) skip this one; the others must render it.
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a prime number."},
    ],
)
PREFILL = {"role": "assistant", "content": "The answer is"}
# Completed assistant turns, each closed with EOS: the legitimate repetition the gate must accept.
HISTORY = (
    {"role": "assistant", "content": "Four."},
    {"role": "user", "content": "And doubled?"},
    {"role": "assistant", "content": "Eight."},
    {"role": "user", "content": "Thanks."},
)


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
    name: str
    reference: str | None  # the row this one is compared with
    ids: tuple[int, ...] | None  # None when the path does not apply or failed
    equal: bool | None  # ids == reference ids
    first_diff: int | None  # first position where they differ (the shorter length for a strict prefix)
    special_positions: tuple[int, ...]
    duplicate_bos: bool  # ids start with BOS twice
    gated: bool  # part of the pass/fail decision
    note: str | None = None  # why the path does not apply, or the exception class

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


def first_diff(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First index where the sequences differ; the shorter length when one is a prefix; None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def special_ids(tok: Any) -> frozenset[int]:
    """Every id the tokenizer treats as special: named specials plus added tokens flagged special."""
    out = set(getattr(tok, "all_special_ids", []) or [])
    for tid, added in (getattr(tok, "added_tokens_decoder", {}) or {}).items():
        if getattr(added, "special", False):
            out.add(int(tid))
    return frozenset(out)


def render(tok: Any, messages: Messages, gen: bool, cont: bool) -> str:
    text = tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=gen, continue_final_message=cont
    )
    return str(text)


def direct_ids(tok: Any, messages: Messages, gen: bool, cont: bool) -> list[int]:
    # transformers 5 returns a BatchEncoding here, not a list: `input_ids` reads its input_ids.
    return input_ids(
        tok.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=gen, continue_final_message=cont
        )
    )


def encode(tok: Any, text: str, add_special_tokens: bool) -> list[int]:
    return input_ids(tok(text, add_special_tokens=add_special_tokens))


_ROLE_SWAPS = (("assistant", "user"), ("Assistant", "User"), ("ASSISTANT", "USER"))


def wrong_role_text(tok: Any, messages: Messages) -> str | None:
    """The prompt with the generation prompt opened for the user role instead of the assistant.

    Found by rendering with and without the generation prompt and swapping the last assistant role name
    that lies in the part only the generation prompt wrote. None when the template has no such part
    (Mistral v0.1 adds nothing for a generation prompt).
    """
    with_gen = render(tok, messages, True, False)
    without = render(tok, messages, False, False)
    common = len(_common_prefix(with_gen, without))
    for old, new in _ROLE_SWAPS:
        at = with_gen.rfind(old)
        if at >= common:
            return with_gen[:at] + new + with_gen[at + len(old) :]
    return None


def _common_prefix(a: str, b: str) -> str:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return a[:n]


def with_prefill(messages: Messages) -> Messages:
    return messages if messages and messages[-1].get("role") == "assistant" else [*messages, PREFILL]


def history(messages: Messages) -> Messages:
    """The conversation continued with completed assistant turns (EOS legitimately repeated)."""
    base = (
        messages if messages[-1].get("role") == "user" else [*messages, {"role": "user", "content": "Go on."}]
    )
    return [*base, *HISTORY]


def serving_ids(tok: Any, messages: Messages, mode: RequestMode) -> list[int] | None:
    """What an adapter of kind `mode.serving_path` sends to the model for these messages."""
    gen, cont = mode.add_generation_prompt, mode.continue_final_message
    if mode.serving_path == SPLIT:
        return encode(tok, render(tok, messages, gen, cont), False)
    if mode.serving_path == EXTRA_SPECIAL:
        return encode(tok, render(tok, messages, gen, cont), True)
    if mode.serving_path == GEN_OFF:
        return direct_ids(tok, messages, False, cont)
    text = wrong_role_text(tok, messages) if gen and not cont else None
    return None if text is None else encode(tok, text, False)


def _path_ids(
    tok: Any, name: str, messages: Messages, mode: RequestMode
) -> tuple[list[int] | None, str | None]:
    gen, cont = mode.add_generation_prompt, mode.continue_final_message
    if name == DIRECT:
        return direct_ids(tok, messages, gen, cont), None
    if name in (SPLIT, EXTRA_SPECIAL):
        return encode(tok, render(tok, messages, gen, cont), name == EXTRA_SPECIAL), None
    if name == GEN_OFF:
        return direct_ids(tok, messages, False, cont), None
    if name == PREFILL_CONTINUED:
        return direct_ids(tok, with_prefill(messages), False, True), None
    if name == PREFILL_CLOSED:
        return direct_ids(tok, with_prefill(messages), False, False), None
    if name == WRONG_ROLE:
        if not gen or cont:
            return None, "no generation prompt in this mode"
        text = wrong_role_text(tok, messages)
        return (None, "template adds no role header") if text is None else (encode(tok, text, False), None)
    if name == MULTI_TURN:
        return direct_ids(tok, history(messages), gen, False), None
    if name == MULTI_TURN_SERVING:
        hist_mode = RequestMode(gen, False, mode.serving_path)
        ids = serving_ids(tok, history(messages), hist_mode)
        return ids, None if ids is not None else "serving path does not apply"
    raise ValueError(name)


# (row, reference row). Order is the table's.
ROWS: tuple[tuple[str, str | None], ...] = (
    (DIRECT, None),
    (SPLIT, DIRECT),
    (EXTRA_SPECIAL, DIRECT),
    (GEN_OFF, DIRECT),
    (PREFILL_CONTINUED, DIRECT),
    (PREFILL_CLOSED, PREFILL_CONTINUED),
    (WRONG_ROLE, DIRECT),
    (MULTI_TURN, None),
    (MULTI_TURN_SERVING, MULTI_TURN),
)


def _dup_bos(ids: Sequence[int], bos_id: int | None) -> bool:
    return bos_id is not None and len(ids) >= 2 and ids[0] == bos_id and ids[1] == bos_id


def check_conversation(
    tok: Any, index: int, messages: Messages, mode: RequestMode, skip_on_error: bool
) -> ConversationParity:
    """Every path of one conversation. Errors on the direct path skip (built-ins) or fail (user input)."""
    if mode.continue_final_message:
        messages = with_prefill(messages)
    specials = special_ids(tok)
    bos_id = getattr(tok, "bos_token_id", None)
    computed: dict[str, list[int] | None] = {}
    rows: list[PathRow] = []
    for name, ref in ROWS:
        try:
            ids, note = _path_ids(tok, name, messages, mode)
        except Exception as exc:  # a template may reject any path; the row records it, never the run
            reason = f"{type(exc).__name__}: {str(exc)[:120]}"
            ids, note = None, f"error: {reason}"
            if name == DIRECT and skip_on_error:
                return ConversationParity(index, messages, (), skipped=f"template rejects it ({reason})")
        computed[name] = ids
        ref_ids = computed.get(ref) if ref else None
        compared = ids is not None and ref_ids is not None
        gated = (name == mode.serving_path) or name == MULTI_TURN_SERVING
        rows.append(
            PathRow(
                name=name,
                reference=ref,
                ids=None if ids is None else tuple(ids),
                equal=(ids == ref_ids) if compared else None,
                first_diff=first_diff(ref_ids, ids) if compared else None,  # type: ignore[arg-type]
                special_positions=tuple(i for i, t in enumerate(ids or ()) if t in specials),
                duplicate_bos=ids is not None and _dup_bos(ids, bos_id),
                gated=gated,
                note=note,
            )
        )
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


def _self_check(tok: Any) -> SelfCheck:
    if template_of(tok) is None:
        return SelfCheck(False, "parity not checked: the tokenizer has no chat template (bare counts only)")
    report = check(tok)
    skipped = len(report.conversations) - report.checked
    skip_note = f", {skipped} skipped (template rejects them)" if skipped else ""
    bos = (
        f"extra special-token pass adds {report.plain_special_tokens} token(s)"
        + (" and duplicates BOS" if report.template_emits_bos else "")
        if report.plain_special_tokens
        else "extra special-token pass adds nothing"
    )
    if report.ok:
        return SelfCheck(
            True, f"parity ok: direct == split on {report.checked} conversations{skip_note}; {bos}"
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
