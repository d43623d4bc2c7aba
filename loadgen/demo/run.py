"""The work behind `islwatch demo` (see loadgen/demo/cli.py): for each scene, start the emulator (broken the way
the scene says) and the proxy in front of it, send the load through the proxy, read the proxy's /metrics,
run the parity gate, print the verdict; stop both children on every way out. Then the summary.

The next scene's emulator and proxy boot while the current scene is judged and stopped (not while its load
runs, so its latencies are its own): most of a scene is two interpreters starting.
"""

from __future__ import annotations

import argparse
import signal
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from loadgen.config import LoadgenConfig
from loadgen.demo import render
from loadgen.demo.parity import parity_lines
from loadgen.demo.scenes import Scene, selected
from loadgen.demo.stack import Addresses, spawn_stack, wait_stack
from loadgen.demo.verdicts import GAUGES, SCENE_SAMPLES, SceneNumbers, surprise
from loadgen.launch import run_loadgen
from loadgen.report.model import LoadgenReport
from loadgen.send import proxy_metrics
from loadgen.send.proxy_metrics import Counts
from loadgen.workload.markers import CacheBust
from proxy.core.specs import DEFAULT_TOKENIZER
from proxy.core.tokenizer import LoadedTokenizer, load_tokenizer
from proxy.runtime.children import Child, address


@dataclass(frozen=True)
class Demo:
    """One run's fixed parts: the flags, where it prints, the loaded tokenizer, the logs folder."""

    args: argparse.Namespace
    console: Console
    loaded: LoadedTokenizer
    logs: Path
    scenes: tuple[Scene, ...]


@dataclass(frozen=True)
class Booted:
    """One scene's emulator and proxy, started; `stack` stops them."""

    scene: Scene
    at: Addresses
    logs: Path
    flags: tuple[str, ...]  # the emulator's
    template: Path | None  # the template the server renders instead of islwatch's
    children: list[Child]
    stack: ExitStack


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def emulator_flags(scene: Scene, logs: Path) -> tuple[tuple[str, ...], Path | None]:
    """The emulator's flags for the scene, and the template file the server renders (if it is swapped)."""
    flags = tuple(arg for f in scene.faults for arg in ("--fault", f))
    if scene.server_template is None:
        return flags, None
    template = logs / "server-template.jinja"
    template.write_text(scene.server_template)
    return (*flags, "--chat-template", str(template)), template


def _addresses(args: argparse.Namespace, last: bool) -> Addresses:
    """The last scene (the one --keep-running keeps) gets the wanted ports; earlier ones any free port."""
    if last:
        return Addresses.choose(args.listen, args.admin)
    return Addresses.choose(f"{address(args.listen)[0]}:0", f"{address(args.admin)[0]}:0")


def boot(demo: Demo, every: ExitStack, index: int) -> Booted | None:
    """Start scene `index`'s children without waiting for them (None past the last scene); `every` stops
    them if the demo ends before the scene does."""
    if index >= len(demo.scenes):
        return None
    scene = demo.scenes[index]
    logs = demo.logs / scene.name
    logs.mkdir()
    flags, template = emulator_flags(scene, logs)
    at = _addresses(demo.args, last=index == len(demo.scenes) - 1)
    stack = every.enter_context(ExitStack())
    return Booted(scene, at, logs, flags, template, spawn_stack(stack, at, logs, flags), stack)


def _per_scene(path: Path | None, scene: Scene, many: bool) -> Path | None:
    """`--output r.json` names one scene's file; with several scenes, r-SCENE.json each."""
    if path is None or not many:
        return path
    return path.with_name(f"{path.stem}-{scene.name}{path.suffix}")


def demo_config(demo: Demo, b: Booted) -> LoadgenConfig:
    args, many = demo.args, len(demo.scenes) > 1
    return LoadgenConfig(
        url=b.at.proxy_url,
        isl=args.isl,
        osl=args.osl,
        turns=args.turns,
        cache_bust=CacheBust.FIRST_TURN_PREFIX,
        concurrency=args.concurrency,
        request_count=args.requests,
        streaming=True,
        proxy_metrics_url=b.at.metrics_url,
        output=_per_scene(args.output, b.scene, many),
        records=_per_scene(args.records, b.scene, many),
    )


def serve_until_ctrl_c(console: Console, children: list[Child]) -> int:
    console.print("Serving until Ctrl-C.")
    while all(c.proc.poll() is None for c in children):
        time.sleep(0.5)
    console.print("[red]a child process exited; stopping[/]")
    return 1


def send(demo: Demo, b: Booted) -> tuple[int, LoadgenReport, Counts]:
    """Wait for the scene's children, send its load: the loadgen's exit code, report, and the counts before."""
    wait_stack(b.at, b.children)
    server = " ".join(["islwatch emulate", *(Path(f).name if f.startswith("/") else f for f in b.flags)])
    demo.console.print(
        f"{server} on {b.at.emu_url}; islwatch proxy on {b.at.proxy_url}", markup=False, soft_wrap=True
    )
    before = proxy_metrics.scrape(b.at.metrics_url, SCENE_SAMPLES)
    if before is None:
        raise RuntimeError(f"scene {b.scene.name}: the proxy's /metrics did not answer")
    shown = demo.console if b.scene.loadgen_report else Console(quiet=True)
    code, report = run_loadgen(demo_config(demo, b), shown)
    if report is None:
        raise RuntimeError(f"scene {b.scene.name}: the loadgen could not start (exit {code})")
    return code, report, before


def judge(demo: Demo, b: Booted, sent: int, before: Counts) -> tuple[SceneNumbers, str | None]:
    """The proxy's /metrics once it has analysed every request, the parity gate, the verdict."""
    delta = proxy_metrics.settled(b.at.metrics_url, before, sent, SCENE_SAMPLES, GAUGES)
    if delta is None:
        raise RuntimeError(f"scene {b.scene.name}: the proxy's /metrics did not answer")
    n = SceneNumbers.of(delta)
    render.numbers(demo.console, delta, n)
    render.lines(demo.console, parity_lines(b.scene, demo.loaded, b.template))
    odd = surprise(b.scene.expect_cause, b.scene.expect_alerts, n)
    render.scene_verdict(demo.console, n, odd)
    return n, odd


def _demo(demo: Demo) -> int:
    codes: list[int] = []
    rows: list[tuple[str, SceneNumbers]] = []
    with ExitStack() as every:  # whatever still runs stops on any way out
        upcoming = boot(demo, every, 0)
        for i in range(len(demo.scenes)):
            b = upcoming
            assert b is not None
            render.scene_header(demo.console, i + 1, len(demo.scenes), b.scene)
            code, report, before = send(demo, b)
            upcoming = boot(demo, every, i + 1)
            n, odd = judge(demo, b, report.requests, before)
            codes.append(code or (1 if odd else 0))
            rows.append((b.scene.name, n))
            if upcoming is None:
                render.summary(demo.console, rows)
                if demo.args.keep_running:
                    render.where_to_look(
                        demo.console, b.at.proxy_url, b.at.metrics_url, b.at.admin, demo.logs
                    )
                    return serve_until_ctrl_c(demo.console, b.children)
            b.stack.close()
    demo.console.print("Stopped every scene's proxy and emulator (`--keep-running` keeps the last).")
    return max(codes)


def run_demo(args: argparse.Namespace) -> int:
    console = render.console()
    signal.signal(signal.SIGTERM, _raise_interrupt)  # SIGTERM stops the demo like Ctrl-C: children first
    console.print(f"islwatch demo: loading {DEFAULT_TOKENIZER} (offline, from mistral-common)")
    # Converts the vocabulary once, before the children race to do it; the parity gate reuses it.
    loaded = load_tokenizer(DEFAULT_TOKENIZER)
    logs = Path(tempfile.mkdtemp(prefix="islwatch-demo-"))
    scenes = selected(args.scene)
    console.print(
        f"{len(scenes)} scene(s), each with its own emulator and proxy; logs in {logs}",
        markup=False,
        soft_wrap=True,
    )
    try:
        return _demo(Demo(args, console, loaded, logs, scenes))
    except KeyboardInterrupt:
        console.print("\nislwatch demo: interrupted, stopping the proxy and the emulator")
        return 130
    except RuntimeError as exc:
        console.print(f"[red]islwatch demo: {exc}[/]")
        return 1
