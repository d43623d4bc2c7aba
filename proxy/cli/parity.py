"""`islwatch parity`: the serialization parity release gate.

Exit codes: 0 when the serving path equals the direct path for every conversation (and its multi-turn
history) and the baseline, if given, is unchanged; 1 with a token diff or the list of changes otherwise;
2 for usage errors (contradictory flags, unreadable files, a tokenizer that does not load).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson
import pydantic
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from proxy.core.tokenizer import LoadedTokenizer, TokenizerLoadError, add_tokenizer_arguments, load_tokenizer
from proxy.core.tokens import template_of
from proxy.parity import baseline as bl
from proxy.parity.gate import (
    DIRECT,
    NEGATIVE_CONTROLS,
    SERVING_PATHS,
    SPLIT,
    WRONG_ROLE,
    ConversationParity,
    Messages,
    ParityReport,
    PathRow,
    RequestMode,
    check,
)

PROG = "islwatch parity"


class UsageError(Exception):
    """Bad flags or inputs: exit 2 with the message."""


def configure(p: argparse.ArgumentParser) -> None:
    add_tokenizer_arguments(p)
    p.add_argument(
        "--messages", help="JSON file: a list of conversations, each a list of OpenAI-style messages"
    )
    p.add_argument(
        "--continue-final-message",
        action="store_true",
        help="continue the final (assistant) message instead of opening a new turn; built-in conversations "
        "get an assistant prefill appended",
    )
    p.add_argument(
        "--generation-prompt",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="add the generation prompt (default: on, off with --continue-final-message)",
    )
    p.add_argument(
        "--serving-path",
        choices=SERVING_PATHS,
        default=SPLIT,
        help="what the serving adapter does, compared against direct: split (render, encode without special "
        "tokens: correct), extra-special (re-adds special tokens: duplicates BOS), gen-off (drops the "
        "generation prompt), wrong-role (opens a user turn); the last three are negative controls",
    )
    p.add_argument("--baseline", help="compare against this baseline file; any change fails")
    p.add_argument("--write-baseline", help="write a baseline file (only when the gate passes)")
    p.add_argument("--json", action="store_true", help="print one JSON report instead of tables")


def _mode(args: argparse.Namespace) -> RequestMode:
    if args.continue_final_message and args.generation_prompt:
        raise UsageError(
            "--continue-final-message and --generation-prompt contradict each other: a continued assistant "
            "message cannot be followed by a new generation prompt"
        )
    gen = not args.continue_final_message if args.generation_prompt is None else args.generation_prompt
    if args.serving_path in ("gen-off", WRONG_ROLE) and not gen:
        raise UsageError(
            f"--serving-path {args.serving_path} needs a generation prompt, and this mode has none"
        )
    if (
        args.baseline
        and args.write_baseline
        and Path(args.baseline).resolve() == Path(args.write_baseline).resolve()
    ):
        raise UsageError("--baseline and --write-baseline name the same file")
    return RequestMode(gen, args.continue_final_message, args.serving_path)


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror}") from exc


def load_conversations(data: bytes) -> list[Messages]:
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise UsageError(f"--messages is not valid JSON: {exc}") from exc
    if not isinstance(value, list) or not value:
        raise UsageError("--messages must be a non-empty JSON list of conversations")
    for i, conv in enumerate(value):
        ok = (
            isinstance(conv, list)
            and conv
            and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in conv)
        )
        if not ok:
            raise UsageError(
                f"--messages conversation {i} is not a non-empty list of messages with a string role"
            )
    return value


def _load_baseline(path: str) -> bl.Baseline:
    try:
        return bl.load(_read(path, "baseline"))
    except (orjson.JSONDecodeError, pydantic.ValidationError) as exc:
        raise UsageError(f"{path} is not an islwatch parity baseline: {str(exc).splitlines()[0]}") from exc


class RowOut(BaseModel):
    name: str
    reference: str | None
    tokens: int | None
    equal: bool | None
    first_diff: int | None
    special_positions: list[int]
    duplicate_bos: bool
    role: str  # gate | control | info
    note: str | None
    ids: list[int] | None


class ConversationOut(BaseModel):
    index: int
    ok: bool
    skipped: str | None
    rows: list[RowOut]


class ParityOut(BaseModel):
    ok: bool
    exit_code: int
    tokenizer: dict[str, Any]
    mode: dict[str, Any]
    plain_special_tokens: int
    template_emits_bos: bool
    blind_controls: list[str]
    conversations: list[ConversationOut]
    baseline_changes: list[bl.Change]
    baseline_written: str | None


def _role(row: PathRow) -> str:
    return "gate" if row.gated else "control" if row.name in NEGATIVE_CONTROLS else "info"


def _output(
    loaded: LoadedTokenizer, report: ParityReport, changes: list[bl.Change], code: int, written: str | None
) -> ParityOut:
    return ParityOut(
        ok=code == 0,
        exit_code=code,
        tokenizer=loaded.identity.as_dict(),
        mode={
            "add_generation_prompt": report.mode.add_generation_prompt,
            "continue_final_message": report.mode.continue_final_message,
            "serving_path": report.mode.serving_path,
        },
        plain_special_tokens=report.plain_special_tokens,
        template_emits_bos=report.template_emits_bos,
        blind_controls=list(report.controls),
        conversations=[
            ConversationOut(
                index=c.index,
                ok=c.ok,
                skipped=c.skipped,
                rows=[
                    RowOut(
                        name=r.name,
                        reference=r.reference,
                        tokens=r.count,
                        equal=r.equal,
                        first_diff=r.first_diff,
                        special_positions=list(r.special_positions),
                        duplicate_bos=r.duplicate_bos,
                        role=_role(r),
                        note=r.note,
                        ids=None if r.ids is None else list(r.ids),
                    )
                    for r in c.rows
                ],
            )
            for c in report.conversations
        ],
        baseline_changes=changes,
        baseline_written=written,
    )


def _positions(pos: tuple[int, ...], limit: int = 10) -> str:
    shown = ",".join(map(str, pos[:limit]))
    return shown + (f",…(+{len(pos) - limit})" if len(pos) > limit else "") if pos else "-"


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else "yes" if value else "NO"


def _table(conv: ConversationParity) -> Table:
    status = "skipped" if conv.skipped else "PASS" if conv.ok else "FAIL"
    table = Table(
        title=f"conversation {conv.index} ({len(conv.messages)} messages): {status}", title_justify="left"
    )
    for col in (
        "path",
        "vs",
        "tokens",
        "equal",
        "first diff",
        "special positions",
        "dup BOS",
        "role",
        "note",
    ):
        table.add_column(col, overflow="fold")
    for r in conv.rows:
        table.add_row(
            r.name,
            r.reference or "-",
            "-" if r.count is None else str(r.count),
            _yes_no(r.equal),
            "-" if r.first_diff is None else str(r.first_diff),
            _positions(r.special_positions),
            "YES" if r.duplicate_bos else "no",
            _role(r),
            r.note or "",
        )
    return table


def token_diff(tok: Any, ref: tuple[int, ...], ids: tuple[int, ...], at: int, width: int = 3) -> list[str]:
    """A few ids and their token strings on both sides of the first difference."""
    lo = max(at - width, 0)

    def side(seq: tuple[int, ...]) -> str:
        window = list(seq[lo : at + width + 1])
        return f"[{lo}:{lo + len(window)}] ids {window} tokens {tok.convert_ids_to_tokens(window)}"

    return [f"    reference {side(ref)}", f"    this path {side(ids)}"]


def _failures(tok: Any, report: ParityReport) -> list[str]:
    lines: list[str] = []
    for conv in report.conversations:
        for row in conv.rows:
            if not row.gated or (row.equal is True and not row.duplicate_bos):
                continue
            ref = conv.row(row.reference or DIRECT)
            if row.ids is None or ref is None or ref.ids is None:
                lines.append(f"conversation {conv.index}: {row.name} could not be compared: {row.note}")
                continue
            what = f"differs from {row.reference} at position {row.first_diff}" if not row.equal else "equal"
            dup = "; starts with a duplicated BOS" if row.duplicate_bos else ""
            lines.append(
                f"conversation {conv.index}: {row.name} {what} ({ref.count} vs {row.count} tokens){dup}"
            )
            if row.first_diff is not None:
                lines.extend(token_diff(tok, ref.ids, row.ids, row.first_diff))
    if report.checked == 0:
        lines.append("no conversation could be rendered: nothing was checked")
    lines.extend(f"negative control blind: {c}" for c in report.controls)
    return lines


def _print_text(
    console: Console, loaded: LoadedTokenizer, report: ParityReport, out: ParityOut, failures: list[str]
) -> None:
    ident = loaded.identity
    console.print(
        f"tokenizer {ident.name} (revision {ident.revision or '-'}, template sha256 {str(ident.template_sha256)[:12]}); "
        f"mode: generation prompt {'on' if report.mode.add_generation_prompt else 'off'}, "
        f"continue final message {'on' if report.mode.continue_final_message else 'off'}, "
        f"serving path {report.mode.serving_path}"
    )
    for conv in report.conversations:
        if conv.skipped:
            console.print(f"conversation {conv.index}: skipped: {conv.skipped}", markup=False)
        else:
            console.print(_table(conv))
    for line in failures:
        console.print(line, markup=False, highlight=False)
    for ch in out.baseline_changes:
        console.print(f"baseline changed: {ch.kind}: {ch.what}: {ch.detail}", markup=False, highlight=False)
    if out.baseline_written:
        console.print(f"baseline written to {out.baseline_written}", markup=False)
    console.print(f"parity {'PASS' if out.ok else 'FAIL'}", markup=False)


def _run(args: argparse.Namespace, console: Console) -> int:
    mode = _mode(args)
    conversations = load_conversations(_read(args.messages, "--messages file")) if args.messages else None
    old = _load_baseline(args.baseline) if args.baseline else None
    try:
        loaded = load_tokenizer(args.tokenizer, args.revision, args.chat_template, args.trust_remote_code)
    except TokenizerLoadError as exc:
        raise UsageError(str(exc)) from exc
    if template_of(loaded.tokenizer) is None:
        raise UsageError("the tokenizer has no chat template (give one with --chat-template)")
    report = check(loaded.tokenizer, conversations, mode)
    new = bl.baseline_from(loaded, report)
    changes = bl.compare(old, new) if old is not None else []
    code = 0 if report.ok and not changes else 1
    written = None
    if args.write_baseline and code == 0:
        Path(args.write_baseline).write_bytes(bl.dump(new))
        written = args.write_baseline
    out = _output(loaded, report, changes, code, written)
    failures = _failures(loaded.tokenizer, report)
    if args.json:
        sys.stdout.write(out.model_dump_json(indent=2) + "\n")
    else:
        _print_text(console, loaded, report, out, failures)
        if args.write_baseline and code != 0:
            console.print("baseline not written: the gate failed", markup=False)
    return code


def run(args: argparse.Namespace) -> int:
    console = Console(width=160, soft_wrap=False)
    try:
        return _run(args, console)
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # writing the baseline
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
