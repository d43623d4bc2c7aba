"""The text output of `islwatch parity`: one rich table per conversation, then the failure lines (a few ids
and token strings around each first difference), the baseline changes and the verdict. With `--server`:
one table of the server parity probes, the token diffs of those that differ, and the verdict."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from proxy.core.parity_gate import ConversationParity, ParityReport
from proxy.core.parity_paths import DIRECT
from proxy.core.tokenizer import LoadedTokenizer
from proxy.parity.baseline import Change
from proxy.parity.server import FAIL, PASS, ServerParity

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


def id_diff(
    tok: Any, a: tuple[int, ...], b: tuple[int, ...], at: int, names: tuple[str, str], width: int = 3
) -> list[str]:
    """A few ids on both sides of the first difference, with their token strings in `tok`'s vocabulary."""
    lo = max(at - width, 0)

    def side(seq: tuple[int, ...]) -> str:
        window = list(seq[lo : at + width + 1])
        return f"[{lo}:{lo + len(window)}] ids {window} tokens {_tokens(tok, window)}"

    return [f"    {names[0]} {side(a)}", f"    {names[1]} {side(b)}"]


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
                lines.extend(id_diff(tok, ref.ids, row.ids, row.first_diff, ("reference", "this path")))
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


# --------------------------------------------------------------------------- `islwatch parity --server`

SERVER_COLUMNS = ("probe", "ours", "theirs", "equal", "first diff")


def server_table(parity: ServerParity) -> Table:
    """One row per probe: token counts on both sides, whether the ids are equal, the first differing position."""
    title = f"server parity probes: {parity.verdict.upper()}"
    out = Table(title=title, title_justify="left")
    for col in SERVER_COLUMNS:
        out.add_column(col, overflow="fold")
    for row in parity.rows:
        r = row.result
        out.add_row(
            row.name,
            str(len(row.ours)),
            "-" if row.theirs is None else str(len(row.theirs)),
            "-" if r is None else _yes_no(r.equal),
            "-" if r is None else _dash(r.first_diff),
        )
    return out


def _tokens(tok: Any, ids: list[int]) -> list[str | None]:
    """Token strings of ids in islwatch's vocabulary (the server's ids may lie outside it)."""
    try:
        return list(tok.convert_ids_to_tokens(ids))
    except Exception:  # an id the vocabulary does not have
        return [None] * len(ids)


def server_failures(tok: Any, parity: ServerParity) -> list[str]:
    lines: list[str] = []
    for row in parity.rows:
        r = row.result
        if r is None or r.equal or row.theirs is None:
            continue
        lines.append(f"{row.name} differs at position {r.first_diff} ({r.ours} vs {r.theirs} tokens)")
        if r.first_diff is not None:
            lines.extend(id_diff(tok, row.ours, row.theirs, r.first_diff, ("islwatch", "server  ")))
    return lines


def _server_header(loaded: LoadedTokenizer, parity: ServerParity) -> str:
    ident = loaded.identity
    return (
        f"tokenizer {ident.name} (revision {ident.revision or '-'}, class {ident.tokenizer_class}, "
        f"transformers {ident.transformers_version}, tokenizers {ident.tokenizers_version}); "
        f"server {parity.url} (model {parity.model or '-'}, /tokenize shape {parity.shape or '-'})"
    )


def print_server_text(console: Console, loaded: LoadedTokenizer, parity: ServerParity) -> None:
    def line(text: str) -> None:  # one line each, never wrapped: greppable
        console.print(text, markup=False, highlight=False, soft_wrap=True)

    line(_server_header(loaded, parity))
    console.print(server_table(parity))
    for text in server_failures(loaded.tokenizer, parity):
        line(text)
    line(parity.summary())
    verdict = {PASS: "PASS", FAIL: "FAIL"}.get(parity.verdict, f"UNKNOWN ({parity.reason})")
    line(f"server parity {verdict}")
