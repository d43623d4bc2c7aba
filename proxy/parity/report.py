"""The `islwatch parity --json` report, built from the gate's dataclasses (the only description of a row).

Keys, in order: ok, exit_code, tokenizer, mode, plain_special_tokens, template_emits_bos, blind_controls,
conversations (index, ok, skipped, rows), baseline_changes, baseline_written. A row is its `PathRow` fields
with `tokens` (its count) after `reference`.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import orjson

from proxy.parity.baseline import Change
from proxy.parity.gate import ConversationParity, ParityReport, PathRow


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


def dumps(report: dict[str, Any]) -> str:
    return orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n"
