"""The parity gate's view of a demo scene (`proxy.parity`, what `islwatch parity` runs), as a few lines.

A scene with a broken serving path runs the gate with `--serving-path` set to what the adapter does; a scene
whose server renders another template writes a baseline from islwatch's template and compares the
server's template with it, which is how a release pipeline catches a template swap: each template on its
own passes the gate (direct == split), only the baseline sees that the ids changed.
"""

from __future__ import annotations

from pathlib import Path

from loadgen.demo.scenes import Scene
from proxy.core.parity_gate import ConversationParity, ParityReport, PathRow, RequestMode, check, first_diff
from proxy.core.parity_paths import DIRECT, SPLIT
from proxy.core.specs import DEFAULT_TOKENIZER
from proxy.core.tokenizer import LoadedTokenizer, load_tokenizer
from proxy.parity import baseline as bl


def _first_failure(report: ParityReport) -> tuple[ConversationParity, PathRow, PathRow] | None:
    for conv in report.conversations:
        for row in conv.rows:
            ref = conv.row(row.reference or DIRECT)
            if row.gated and not (row.equal is True and not row.duplicate_bos) and ref is not None:
                return conv, row, ref
    return None


def gate_lines(loaded: LoadedTokenizer, serving_path: str) -> list[str]:
    report = check(loaded.tokenizer, mode=RequestMode(serving_path=serving_path))
    skipped = len(report.conversations) - report.checked
    head = f"parity gate, --serving-path {serving_path}:"
    found = _first_failure(report)
    if report.ok or found is None:
        skip = f", {skipped} skipped: the template rejects a system role" if skipped else ""
        return [f"{head} PASS ({serving_path} == direct on {report.checked} conversations{skip})"]
    conv, row, ref = found
    ids = list(row.ids or ())
    at = row.first_diff or 0
    shown = ids[: at + 1]
    tokens = ", ".join(map(repr, loaded.tokenizer.convert_ids_to_tokens(shown)))
    dup = ": BOS twice" if row.duplicate_bos else ""
    return [
        f"{head} FAIL at position {at} of conversation {conv.index}: {ref.count} intended tokens, "
        f"{row.count} sent, ids start {shown} ({tokens}){dup}"
    ]


def _at(loaded: LoadedTokenizer, ids: list[int], at: int) -> str:
    """The id at a position and its token string, or `end` past the end."""
    return f"{ids[at]} {loaded.tokenizer.convert_ids_to_tokens(ids[at])!r}" if at < len(ids) else "end"


def _direct_diff(old: bl.Baseline, new: bl.Baseline, loaded: LoadedTokenizer) -> str | None:
    """The first conversation whose direct ids changed: where, and the two tokens there."""
    for a, b in zip(old.conversations, new.conversations, strict=False):
        was, now = a.paths.get(DIRECT), b.paths.get(DIRECT)
        at = None if was is None or now is None else first_diff(was, now)
        if was is None or now is None or at is None:
            continue
        return (
            f"FAIL at position {at} of conversation {a.index}: {_at(loaded, was, at)} -> {_at(loaded, now, at)} "
            f"({len(was)} -> {len(now)} tokens)"
        )
    return None


def swap_lines(loaded: LoadedTokenizer, server_template: Path) -> list[str]:
    server = load_tokenizer(DEFAULT_TOKENIZER, chat_template_file=str(server_template))
    ours = bl.baseline_from(loaded, check(loaded.tokenizer))
    report = check(server.tokenizer)
    theirs = bl.baseline_from(server, report)
    changes = bl.compare(ours, theirs)
    first = _direct_diff(ours, theirs, loaded)
    ids = sum(c.kind == "ids" for c in changes)
    lines = [
        f"parity gate, the server's template alone: {'PASS' if report.ok else 'FAIL'} "
        f"({SPLIT} == direct: each template is self-consistent)",
        "parity gate, the server's template against a baseline of islwatch's: "
        + (f"{first}; {ids} id changes in all" if first else "PASS" if not changes else "FAIL"),
    ]
    lines += [f"  {c.what}: {c.detail}" for c in changes if c.kind == "template"]
    return lines


def parity_lines(scene: Scene, loaded: LoadedTokenizer, server_template: Path | None) -> list[str]:
    if server_template is not None:
        return swap_lines(loaded, server_template)
    return gate_lines(loaded, scene.serving_path)
