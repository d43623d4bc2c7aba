"""The `islwatch parity --json` report, built from the gate's dataclasses (the only description of a row).

Keys, in order: ok, exit_code, tokenizer, mode, plain_special_tokens, template_emits_bos, blind_controls,
conversations (index, ok, skipped, rows), baseline_changes, baseline_written. A row is its `PathRow` fields
with `tokens` (its count) after `reference`.

With `--server` (`server_report_json`): ok, exit_code, verdict (pass, fail, unknown), reason (unknown only:
no_tokenize, unreachable), detail, summary, server (url, model, shape), tokenizer, probes (name, text,
equal, first_diff, ours, theirs: token counts, then ours_ids, theirs_ids). `equal`, `first_diff`, `theirs`
and `theirs_ids` are null while the verdict is unknown.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import orjson

from proxy.core.parity_gate import ConversationParity, ParityReport, PathRow
from proxy.parity.baseline import Change
from proxy.parity.server import ProbeRow, ServerParity


def row_json(row: PathRow) -> dict[str, Any]:
    name, reference, *rest = asdict(row).items()
    return dict([name, reference, ("tokens", row.count), *rest])


def conversation_json(conv: ConversationParity) -> dict[str, Any]:
    return {
        "index": conv.index,
        "ok": conv.ok,
        "skipped": conv.skipped,
        "rows": [row_json(r) for r in conv.rows],
    }


def report_json(
    tokenizer: dict[str, Any],
    report: ParityReport,
    changes: list[Change],
    exit_code: int,
    written: str | None,
) -> dict[str, Any]:
    """The whole report: the gate's result, the baseline comparison and what the command did."""
    return {
        "ok": exit_code == 0,
        "exit_code": exit_code,
        "tokenizer": tokenizer,
        "mode": asdict(report.mode),
        "plain_special_tokens": report.plain_special_tokens,
        "template_emits_bos": report.template_emits_bos,
        "blind_controls": list(report.controls),
        "conversations": [conversation_json(c) for c in report.conversations],
        "baseline_changes": [c.model_dump(mode="json") for c in changes],
        "baseline_written": written,
    }


def probe_json(row: ProbeRow) -> dict[str, Any]:
    r = row.result
    return {
        "name": row.name,
        "text": row.text,
        "equal": None if r is None else r.equal,
        "first_diff": None if r is None else r.first_diff,
        "ours": len(row.ours),
        "theirs": None if row.theirs is None else len(row.theirs),
        "ours_ids": list(row.ours),
        "theirs_ids": None if row.theirs is None else list(row.theirs),
    }


def server_report_json(tokenizer: dict[str, Any], parity: ServerParity) -> dict[str, Any]:
    """The `--server` report: the verdict, the server, the tokenizer and every probe."""
    return {
        "ok": parity.exit_code == 0,
        "exit_code": parity.exit_code,
        "verdict": parity.verdict,
        "reason": parity.reason,
        "detail": parity.detail,
        "summary": parity.summary(),
        "server": {"url": parity.url, "model": parity.model, "shape": parity.shape},
        "tokenizer": tokenizer,
        "probes": [probe_json(r) for r in parity.rows],
    }


def dumps(report: dict[str, Any]) -> str:
    return orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n"
