"""Analysis cost per request vs a raw `tokenizers` encode of the same rendered text, per shared tokenizer.

Contenders, run in rotating order on every request (so drift in machine load hits all three alike):
  raw   `tok.backend_tokenizer.encode(rendered, add_special_tokens=False)`: the floor, rendered text given
  ref   `proxy.core.count.count_request(tok, "chat", body)`: the counting core as the proxy calls it
  fast  `count(FastEncoder(tok), "chat", body)` (proxy/core/fast.py): same result, reusing work where proven

Shapes: "1-turn" (one ~1,000-token user message, a new conversation per request), "10-turn" (conversations
that grow to ~1,000 tokens over 10 user turns; every turn is a request carrying the whole history, as chat
clients send it) and "40-turn", the long-context agentic case of issue 14: one conversation of 40 user turns
with assistant replies, ~2,800 tokens per turn, whose last request is ~112k tokens (> 100k on every family),
every turn a request carrying the whole history. The fast encoder's caches are emptied at the start of each
round, so reuse only comes from earlier requests of the same run. Every fast result is compared with the
reference result. The rows also give the last request's tokens and milliseconds (for 40-turn: the whole
112k-token history, the issue's "~22 ms per request, 0.04x a raw encode").

"agent-20" is an agent loop: a system prompt, tools, a user task, then 20 rounds of an assistant turn with
reasoning and a tool call followed by its result; every round is a request carrying the whole
history and ending on a tool result (~300 tokens added per round), the traffic reasoning models serve.

The long shape runs `--long-rounds` rounds (default 1: its 40 requests already take ~a minute per family,
most of it in raw and ref encodes of ~100k tokens) and times `ref` on every `--long-ref-every`-th request and
the last one (default 1: all of them); fast is compared with ref on exactly those. `--quick` keeps the long
shape at 8 turns (~22k tokens).

Usage: python -m bench.analysis_cost [--families a,b] [--rounds 3] [--requests 40] [--long-turns 40]
       [--long-rounds 1] [--long-ref-every 1] [--agent-rounds 20] [--quick]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import jinja2

from bench._common import FAMILIES, TEST_TOKENIZERS, machine, median, prose, words_for_tokens, write_result
from bench._common import conversation as make_conversation
from proxy.core.count import count, count_request
from proxy.core.fast import FastEncoder
from proxy.core.tokenizer import load_tokenizer

TARGET_RATIO = 1.2
LONG_TURNS = 40
LONG_TOKENS_PER_TURN = 2800  # 40 turns: the last request ~112k tokens, as in issue 14
LONG_MIN_TOKENS = 100_000  # the full-size long shape must reach past this on every family
QUICK_LONG_TURNS = 8


@dataclass
class Timings:
    wall: dict[int, float] = field(default_factory=dict)  # request index (over all rounds) -> seconds
    cpu: dict[int, float] = field(default_factory=dict)  # process CPU seconds (all threads)


AGENT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ').capitalize()} in the project's files.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "query": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
    for name in ("read_file", "search_code", "run_tests")
]


def agent_loop(rng: random.Random, rounds: int) -> list[list[dict[str, Any]]]:
    """Each round's whole history: system, user task, then rounds of (assistant reasoning + tool calls,
    tool results), each request ending on a tool result."""

    def text(n: int) -> str:
        return prose(rng, n)

    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the tools."},
        {"role": "user", "content": text(60)},
    ]
    out = []
    for r in range(rounds):
        calls = [
            {
                "id": f"call_{r}_{k}",
                "type": "function",
                "function": {
                    "name": rng.choice(AGENT_TOOLS)["function"]["name"],
                    "arguments": f'{{"path": "src/m{r}.py"}}',
                },
            }
            for k in range(1)  # one call a turn: Llama-3.1's template refuses parallel calls
        ]
        messages.append(
            {"role": "assistant", "content": "", "reasoning_content": text(40), "tool_calls": calls}
        )
        messages.extend({"role": "tool", "tool_call_id": c["id"], "content": text(100)} for c in calls)
        out.append(list(messages))
    return out


def requests_for(tok: Any, shape: str, n_requests: int, seed: int) -> list[dict[str, Any]]:
    """Request bodies; for "N-turn" shapes, every turn of each N-turn conversation (n_requests rounded up);
    for "agent-N", every round of agent loops of N rounds."""
    rng = random.Random(seed)
    if shape.startswith("agent-"):
        bodies: list[dict[str, Any]] = []
        while len(bodies) < n_requests:
            loop = agent_loop(rng, int(shape.split("-")[1]))
            bodies.extend({"messages": m, "tools": AGENT_TOOLS} for m in loop)
        return bodies
    if shape == "1-turn":
        words = words_for_tokens(tok, 1000, 1)
        return [{"messages": make_conversation(rng, 1, words)} for _ in range(n_requests)]
    turns = int(shape.split("-")[0])
    target = 1000 if turns == 10 else LONG_TOKENS_PER_TURN * turns
    words = words_for_tokens(tok, target, turns)
    bodies: list[dict[str, Any]] = []
    while len(bodies) < n_requests:
        msgs = make_conversation(rng, turns, words)
        bodies.extend({"messages": msgs[: 2 * k + 1]} for k in range(turns))
    return bodies


def timed(fn: Any, i: int, out: Timings) -> Any:
    c0, w0 = time.process_time(), time.perf_counter()
    result = fn()
    w1, c1 = time.perf_counter(), time.process_time()
    out.wall[i] = w1 - w0
    out.cpu[i] = c1 - c0
    return result


def run_shape(
    tok: Any, fc: FastEncoder, shape: str, rounds: int, n_requests: int, ref_every: int = 1
) -> dict[str, Any]:
    bodies = requests_for(tok, shape, n_requests, seed=7)
    rendered = [
        tok.apply_chat_template(
            b["messages"], tools=b.get("tools"), tokenize=False, add_generation_prompt=True
        )
        for b in bodies
    ]
    backend = tok.backend_tokenizer
    tokens = [len(backend.encode(r, add_special_tokens=False).ids) for r in rendered]
    t = {name: Timings() for name in ("raw", "ref", "fast")}
    mismatches, last = 0, len(bodies) - 1
    for rnd in range(rounds):
        fc.clear_caches()
        for j, (body, text) in enumerate(zip(bodies, rendered, strict=True)):
            calls = {
                "raw": lambda text=text: backend.encode(text, add_special_tokens=False),
                "ref": lambda body=body: count_request(tok, "chat", body),
                "fast": lambda body=body: count(fc, "chat", body),
            }
            with_ref = j % ref_every == ref_every - 1 or j == last
            order = ["raw", "ref", "fast"] if with_ref else ["raw", "fast"]
            k, i = (j + rnd) % len(order), rnd * len(bodies) + j
            results = {name: timed(calls[name], i, t[name]) for name in order[k:] + order[:k]}
            mismatches += with_ref and results["fast"] != results["ref"]
    return summarise(t, tokens, rounds, mismatches) | {"cache": fc.cache_stats()}


def summarise(t: dict[str, Timings], tokens: list[int], rounds: int, mismatches: int) -> dict[str, Any]:
    raw = t["raw"]
    # Per-request ratios (same request, same moment), then the median: robust to a preempted call. Sums and
    # CPU ratios are over the requests each contender ran (ref may skip some of the long shape's).
    ratio = {k: median([w / raw.wall[i] for i, w in v.wall.items()]) for k, v in t.items()}
    ratio_wall = {k: sum(v.wall.values()) / sum(raw.wall[i] for i in v.wall) for k, v in t.items()}
    ratio_cpu = {k: sum(v.cpu.values()) / sum(raw.cpu[i] for i in v.cpu) for k, v in t.items()}
    last = max(raw.wall)  # the last request of the last round: for N-turn shapes, the whole history
    return {
        "ratio_median": ratio,
        "requests": len(tokens) * rounds,
        "ref_requests": len(t["ref"].wall),
        "tokens_median": median([float(n) for n in tokens]),
        "tokens_max": max(tokens),
        "last_tokens": tokens[-1],
        "last_ms": {k: v.wall[last] * 1e3 for k, v in t.items()},
        "ms_median": {k: median(list(v.wall.values())) * 1e3 for k, v in t.items()},
        "ratio_wall": ratio_wall,  # sum over requests
        "ratio_cpu": ratio_cpu,
        "mismatches": mismatches,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--requests", type=int, default=40, help="requests per shape (10-turn: whole conversations)"
    )
    p.add_argument("--long-turns", type=int, default=LONG_TURNS, help="user turns of the long shape")
    p.add_argument("--long-rounds", type=int, default=1, help="rounds of the long shape")
    p.add_argument("--agent-rounds", type=int, default=20, help="tool-call rounds of the agent shape")
    p.add_argument("--long-ref-every", type=int, default=1, help="long shape: time ref on every k-th request")
    p.add_argument(
        "--quick", action="store_true", help=f"1 round, 10 requests, {QUICK_LONG_TURNS}-turn long shape"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.requests, args.long_turns, args.long_rounds = 1, 10, QUICK_LONG_TURNS, 1
    return args


def print_row(fam: str, shape: str, r: dict[str, Any], reuse: bool) -> None:
    ms, rw, rc, lm = r["ms_median"], r["ratio_median"], r["ratio_cpu"], r["last_ms"]
    print(
        f"{fam:26} {shape:8} {r['tokens_max']:6d} {ms['raw']:7.3f} {ms['ref']:7.3f} {ms['fast']:7.3f} "
        f"{rw['ref']:6.2f}x {rw['fast']:7.2f}x {rc['fast']:11.2f}x {lm['fast']:8.2f} {lm['raw']:8.2f}  {reuse}"
        + (f"  MISMATCHES={r['mismatches']}" if r["mismatches"] else "")
        + (f"  (ref on {r['ref_requests']} of {r['requests']})" if r["ref_requests"] < r["requests"] else "")
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    out: dict[str, Any] = {"machine": machine(), "target_ratio": TARGET_RATIO, "families": {}}
    long_shape = f"{args.long_turns}-turn"
    agent_shape = f"agent-{args.agent_rounds}"
    shapes = [("1-turn", args.rounds, args.requests, 1), ("10-turn", args.rounds, args.requests, 1),
              (agent_shape, args.rounds, args.agent_rounds, 1),
              (long_shape, args.long_rounds, args.long_turns, args.long_ref_every)]  # fmt: skip
    print(
        f"{'family':26} {'shape':8} {'tok':>6} {'raw ms':>7} {'ref ms':>7} {'fast ms':>7} "
        f"{'ref/raw':>7} {'fast/raw':>8} {'fast cpu/raw':>12} {'last ms: fast':>13} {'raw':>8}  reuse"
    )
    print("(x/raw: median over requests of the per-request wall ratio; cpu: summed process CPU, all threads;")
    print(" tok: largest request; last ms: the last request of the last round, the whole history)")
    short = []
    for fam in families:
        folder = TEST_TOKENIZERS / fam
        if not folder.is_dir():
            print(f"{fam:26} skipped: {folder} not present", file=sys.stderr)
            continue
        tok = load_tokenizer(str(folder)).tokenizer
        t0 = time.perf_counter()
        fc = FastEncoder(tok)
        build_s = time.perf_counter() - t0
        fam_out: dict[str, Any] = {
            "fastcounter_build_seconds": build_s,
            "direct_proven": fc.direct_proven,
            "reuse_proven": fc.reuse_proven,
            "shapes": {},
        }
        for shape, rounds, n_requests, ref_every in shapes:
            t0 = time.perf_counter()
            try:
                r = run_shape(tok, fc, shape, rounds, n_requests, ref_every)
            except jinja2.TemplateError as exc:  # Gemma 3's roles must alternate: the server answers 400 too
                print(f"{fam:26} {shape:8} not counted: the chat template refuses it ({exc})"[:160])
                fam_out.setdefault("refused_shapes", {})[shape] = str(exc)[:200]
                continue
            r["seconds"] = time.perf_counter() - t0
            fam_out["shapes"][shape] = r
            print_row(fam, shape, r, fc.reuse_proven)
        if args.long_turns == LONG_TURNS and fam_out["shapes"][long_shape]["last_tokens"] <= LONG_MIN_TOKENS:
            short.append(fam)
        out["families"][fam] = fam_out
    out["long_shape"] = {"name": long_shape, "turns": args.long_turns, "under_min_tokens": short}
    if short:
        print(f"long shape under {LONG_MIN_TOKENS} tokens on: {', '.join(short)}", file=sys.stderr)
    path = write_result("analysis_cost", out)
    print(f"wrote {path}")
    bad = sum(s["mismatches"] for f in out["families"].values() for s in f["shapes"].values())
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
