"""`islwatch demo`: scenes of a serving stack, each an emulator with a proxy in front and a short exactly
budgeted load through both: a correct deployment, then drift caught and named (loadgen/demo/scenes.py).

Offline and GPU-free: the tokenizer is the Mistral v0.1 vocabulary that mistral-common ships. Its chat
template rejects a system role, so the demo's conversations are user/assistant turns, marked on the first
user turn. The emulator and the proxy run as child processes (as they would in production); the demo stops
them on exit, on Ctrl-C and on SIGTERM, and they die with it if it is killed outright (PR_SET_PDEATHSIG).

`configure` needs only light imports, so `islwatch demo --help` answers at once; the work is in
loadgen/demo/run.py, imported by `run`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from loadgen.demo.scenes import SCENE_NAMES


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scene",
        choices=SCENE_NAMES,
        help=f"run one scene (default: all, in order: {', '.join(SCENE_NAMES)})",
    )
    p.add_argument(
        "--listen", default="127.0.0.1:9000", help="proxy traffic address (default 127.0.0.1:9000)"
    )
    p.add_argument(
        "--admin", default="127.0.0.1:9100", help="proxy /metrics address (default 127.0.0.1:9100)"
    )
    p.add_argument("--requests", type=int, default=40, help="requests per scene (default 40)")
    p.add_argument("--isl", type=int, default=256, help="tokens per user turn (default 256)")
    p.add_argument("--osl", type=int, default=32, help="max_tokens (default 32)")
    p.add_argument("--turns", type=int, default=2, help="turns per conversation (default 2)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument(
        "--keep-running",
        action="store_true",
        help="keep the last scene's emulator and proxy serving until Ctrl-C",
    )
    p.add_argument(
        "--output", type=Path, help="write the loadgen report as JSON (several scenes: FILE-SCENE.json each)"
    )
    p.add_argument(
        "--records", type=Path, help="write one JSON line per request (several scenes: FILE-SCENE.* each)"
    )


def run(args: argparse.Namespace) -> int:
    from loadgen.demo.run import run_demo  # the tokenizer, the loadgen and rich: only when the demo runs

    return run_demo(args)
