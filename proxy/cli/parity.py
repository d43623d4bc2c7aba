"""`islwatch parity`: the serialization parity release gate.

Exit codes: 0 when the serving path equals the direct path for every conversation (and its multi-turn
history) and the baseline, if given, is unchanged; 1 with a token diff or the list of changes otherwise;
2 for usage errors (contradictory flags, unreadable files, a tokenizer that does not load).

With `--server URL` the gate runs the server parity probes instead (proxy/parity/server.py): 0 when the
server's `/tokenize` gives islwatch's ids for every probe, 1 when any differs, 2 for usage errors and
when parity is unknown (the server has no usable `/tokenize`, or cannot be reached): never a pass.

Only light modules are imported at module level, so `islwatch parity --help` loads no transformers, rich or
pydantic; `run` imports what the gate needs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from proxy.cli.args import add_tokenizer_arguments
from proxy.core.parity_paths import GEN_OFF, SERVING_PATHS, SPLIT, WRONG_ROLE
from proxy.core.tokens import Messages

if TYPE_CHECKING:
    from rich.console import Console

    from proxy.core.parity_gate import RequestMode
    from proxy.parity.baseline import Baseline

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
    p.add_argument(
        "--server",
        metavar="URL",
        help="instead of the serialization gate, run the server parity probes: compare islwatch's ids with "
        "the server's POST /tokenize (vLLM or llama.cpp; the server's root URL, e.g. http://vllm:8000)",
    )
    p.add_argument(
        "--model",
        help="with --server: the served model name, sent as vLLM's `model` field (default: omitted)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON report instead of tables")


def _mode(args: argparse.Namespace) -> RequestMode:
    from proxy.core.parity_gate import RequestMode

    if args.continue_final_message and args.generation_prompt:
        raise UsageError(
            "--continue-final-message and --generation-prompt contradict each other: a continued assistant "
            "message cannot be followed by a new generation prompt"
        )
    gen = not args.continue_final_message if args.generation_prompt is None else args.generation_prompt
    if args.serving_path in (GEN_OFF, WRONG_ROLE) and not gen:
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


def _load_baseline(path: str) -> Baseline:
    import pydantic

    from proxy.parity import baseline as bl

    try:
        return bl.load(_read(path, "baseline"))
    except (orjson.JSONDecodeError, pydantic.ValidationError) as exc:
        raise UsageError(f"{path} is not an islwatch parity baseline: {str(exc).splitlines()[0]}") from exc


def _server_conflicts(args: argparse.Namespace) -> list[str]:
    """The gate's own flags, which mean nothing to the server probes."""
    given = [
        ("--messages", args.messages is not None),
        ("--baseline", args.baseline is not None),
        ("--write-baseline", args.write_baseline is not None),
        ("--continue-final-message", args.continue_final_message),
        ("--generation-prompt/--no-generation-prompt", args.generation_prompt is not None),
        ("--serving-path", args.serving_path != SPLIT),
    ]
    return [flag for flag, on in given if on]


def _run_server(args: argparse.Namespace, console: Console) -> int:
    from proxy.core.tokenizer import TokenizerLoadError, load_tokenizer
    from proxy.parity.render import print_server_text
    from proxy.parity.report import dumps, server_report_json
    from proxy.parity.server import UNKNOWN, check_url, run_probe

    conflicts = _server_conflicts(args)
    if conflicts:
        raise UsageError(
            f"--server runs the server parity probes only; {', '.join(conflicts)} belong to the "
            "serialization gate (run it separately)"
        )
    bad_url = check_url(args.server)
    if bad_url is not None:
        raise UsageError(bad_url)
    try:
        loaded = load_tokenizer(args.tokenizer, args.revision, args.chat_template, args.trust_remote_code)
    except TokenizerLoadError as exc:
        raise UsageError(str(exc)) from exc
    parity = run_probe(loaded.tokenizer, args.server, args.model)
    if args.json:
        sys.stdout.write(dumps(server_report_json(loaded.identity.as_dict(), parity)))
    else:
        print_server_text(console, loaded, parity)
    if parity.verdict == UNKNOWN:
        print(f"{PROG}: {parity.summary()}", file=sys.stderr)
    return parity.exit_code


def _run(args: argparse.Namespace, console: Console) -> int:
    if args.server is not None:
        return _run_server(args, console)
    if args.model is not None:
        raise UsageError("--model is only used with --server")
    from proxy.core.parity_gate import check
    from proxy.core.tokenizer import TokenizerLoadError, load_tokenizer
    from proxy.core.tokens import template_of
    from proxy.parity import baseline as bl
    from proxy.parity.render import print_text
    from proxy.parity.report import dumps, report_json

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
    if args.json:
        sys.stdout.write(dumps(report_json(loaded.identity.as_dict(), report, changes, code, written)))
    else:
        print_text(console, loaded, report, changes, written, passed=code == 0)
        if args.write_baseline and code != 0:
            console.print("baseline not written: the gate failed", markup=False)
    return code


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(width=160, soft_wrap=False)
    try:
        return _run(args, console)
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # writing the baseline
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
