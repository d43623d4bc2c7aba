"""The text output of `islwatch parity`: one rich table per conversation, then the failure lines (a few ids
and token strings around each first difference), the baseline changes and the verdict."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from proxy.core.tokenizer import LoadedTokenizer
from proxy.parity.baseline import Change
from proxy.parity.gate import ConversationParity, ParityReport
from proxy.parity.paths import DIRECT

COLUMNS = ("path", "vs", "tokens", "equal", "first diff", "special positions", "dup BOS", "role", "note")


def _positions(pos: tuple[int, ...], limit: int = 10) -> str:
    shown = ",".join(map(str, pos[:limit]))
    return shown + (f",…(+{len(pos) - limit})" if len(pos) > limit else "") if pos else "-"


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else "yes" if value else "NO"


def _dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def table(conv: ConversationParity) -> Table:
    status = "skipped" if conv.skipped else "PASS" if conv.ok else "FAIL"
    out = Table(
        title=f"conversation {conv.index} ({len(conv.messages)} messages): {status}", title_justify="left"
    )
    for col in COLUMNS:
        out.add_column(col, overflow="fold")
    for r in conv.rows:
        out.add_row(
            r.name,
            r.reference or "-",
            _dash(r.count),
            _yes_no(r.equal),
            _dash(r.first_diff),
            _positions(r.special_positions),
            "YES" if r.duplicate_bos else "no",
            r.role,
            r.note or "",
        )
    return out


def token_diff(tok: Any, ref: tuple[int, ...], ids: tuple[int, ...], at: int, width: int = 3) -> list[str]:
    """A few ids and their token strings on both sides of the first difference."""
    lo = max(at - width, 0)

    def side(seq: tuple[int, ...]) -> str:
        window = list(seq[lo : at + width + 1])
        return f"[{lo}:{lo + len(window)}] ids {window} tokens {tok.convert_ids_to_tokens(window)}"

    return [f"    reference {side(ref)}", f"    this path {side(ids)}"]


def failures(tok: Any, report: ParityReport) -> list[str]:
    """One line per gated row that failed (with a token diff where ids differ), then what was not checked."""
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


def _header(loaded: LoadedTokenizer, report: ParityReport) -> str:
    ident, mode = loaded.identity, report.mode
    return (
        f"tokenizer {ident.name} (revision {ident.revision or '-'}, "
        f"template sha256 {str(ident.template_sha256)[:12]}); "
        f"mode: generation prompt {'on' if mode.add_generation_prompt else 'off'}, "
        f"continue final message {'on' if mode.continue_final_message else 'off'}, "
        f"serving path {mode.serving_path}"
    )


def print_text(
    console: Console,
    loaded: LoadedTokenizer,
    report: ParityReport,
    changes: list[Change],
    written: str | None,
    passed: bool,
) -> None:
    console.print(_header(loaded, report))
    for conv in report.conversations:
        if conv.skipped:
            console.print(f"conversation {conv.index}: skipped: {conv.skipped}", markup=False)
        else:
            console.print(table(conv))
    for line in failures(loaded.tokenizer, report):
        console.print(line, markup=False, highlight=False)
    for ch in changes:
        console.print(f"baseline changed: {ch.kind}: {ch.what}: {ch.detail}", markup=False, highlight=False)
    if written:
        console.print(f"baseline written to {written}", markup=False)
    console.print(f"parity {'PASS' if passed else 'FAIL'}", markup=False)
