"""Analysis cost per request vs a raw `tokenizers` encode of the same rendered text, per shared tokenizer.

Contenders, run in rotating order on every request (so drift in machine load hits all three alike):
  raw   `tok.backend_tokenizer.encode(rendered, add_special_tokens=False)`: the floor, rendered text given
  ref   `proxy.core.count.count_request(tok, "chat", body)`: the counting core as the proxy calls it
  fast  `count(FastEncoder(tok), "chat", body)` (proxy/core/fast.py): same result, reusing work where proven

Shapes: "1-turn" (one ~1,000-token user message, a new conversation per request) and "10-turn" (conversations
that grow to ~1,000 tokens over 10 user turns; every turn is a request carrying the whole history, as chat
clients send it). The fast encoder's caches are emptied at the start of each round, so reuse only comes from
earlier requests of the same run. Every fast result is compared with the reference result.

Usage: python -m bench.analysis_cost [--families a,b] [--rounds 3] [--requests 40] [--quick]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench._common import FAMILIES, SHARED_TOKENIZERS, machine, median, words_for_tokens, write_result
from bench._common import conversation as make_conversation
from proxy.core.count import count, count_request
from proxy.core.fast import FastEncoder
from proxy.core.tokenizer import load_tokenizer

TARGET_RATIO = 1.2


@dataclass
class Timings:
    wall: list[float] = field(default_factory=list)  # seconds per request
    cpu: list[float] = field(default_factory=list)  # process CPU seconds per request (all threads)


def requests_for(tok: Any, shape: str, n_requests: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    if shape == "1-turn":
        words = words_for_tokens(tok, 1000, 1)
        return [{"messages": make_conversation(rng, 1, words)} for _ in range(n_requests)]
    words = words_for_tokens(tok, 1000, 10)
    bodies: list[dict[str, Any]] = []
    while len(bodies) < n_requests:
        msgs = make_conversation(rng, 10, words)
        bodies.extend({"messages": msgs[: 2 * k + 1]} for k in range(10))
    return bodies


def timed(fn: Any, out: Timings) -> Any:
    c0, w0 = time.process_time(), time.perf_counter()
    result = fn()
    w1, c1 = time.perf_counter(), time.process_time()
    out.wall.append(w1 - w0)
    out.cpu.append(c1 - c0)
    return result


def run_shape(tok: Any, fc: FastEncoder, shape: str, rounds: int, n_requests: int) -> dict[str, Any]:
    bodies = requests_for(tok, shape, n_requests, seed=7)
    rendered = [
        tok.apply_chat_template(b["messages"], tokenize=False, add_generation_prompt=True) for b in bodies
    ]
    backend = tok.backend_tokenizer
    tokens = [len(backend.encode(r, add_special_tokens=False).ids) for r in rendered]
    t = {name: Timings() for name in ("raw", "ref", "fast")}
    mismatches = 0
    for rnd in range(rounds):
        fc.clear_caches()
        for i, (body, text) in enumerate(zip(bodies, rendered, strict=True)):
            calls = {
                "raw": lambda text=text: backend.encode(text, add_special_tokens=False),
                "ref": lambda body=body: count_request(tok, "chat", body),
                "fast": lambda body=body: count(fc, "chat", body),
            }
            order = ["raw", "ref", "fast"]
            k = (i + rnd) % 3
            results = {name: timed(calls[name], t[name]) for name in order[k:] + order[:k]}
            mismatches += results["fast"] != results["ref"]
    raw_wall, raw_cpu = sum(t["raw"].wall), sum(t["raw"].cpu)
    # Per-request ratios (same request, same moment), then the median: robust to a preempted call.
    per_request = {
        k: median([a / b for a, b in zip(v.wall, t["raw"].wall, strict=True)]) for k, v in t.items()
    }
    return {
        "ratio_median": per_request,
        "requests": len(bodies) * rounds,
        "tokens_median": median([float(n) for n in tokens]),
        "tokens_max": max(tokens),
        "ms_median": {k: median(v.wall) * 1e3 for k, v in t.items()},
        "ratio_wall": {k: sum(v.wall) / raw_wall for k, v in t.items()},  # sum over requests
        "ratio_cpu": {k: sum(v.cpu) / raw_cpu for k, v in t.items()},
        "mismatches": mismatches,
        "cache": fc.cache_stats(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--requests", type=int, default=40, help="requests per shape (10-turn: whole conversations)"
    )
    p.add_argument("--quick", action="store_true", help="1 round, 10 requests (a smoke run)")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.requests = 1, 10
    families = [f for f in args.families.split(",") if f]
    out: dict[str, Any] = {"machine": machine(), "target_ratio": TARGET_RATIO, "families": {}}
    print(
        f"{'family':26} {'shape':7} {'tok':>5} {'raw ms':>7} {'ref ms':>7} {'fast ms':>7} "
        f"{'ref/raw':>7} {'fast/raw':>8} {'fast cpu/raw':>12}  reuse"
    )
    print("(x/raw: median over requests of the per-request wall ratio; cpu: summed process CPU, all threads)")
    for fam in families:
        folder = SHARED_TOKENIZERS / fam
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
        for shape in ("1-turn", "10-turn"):
            r = run_shape(tok, fc, shape, args.rounds, args.requests)
            fam_out["shapes"][shape] = r
            ms, rw, rc = r["ms_median"], r["ratio_median"], r["ratio_cpu"]
            print(
                f"{fam:26} {shape:7} {r['tokens_max']:5d} {ms['raw']:7.3f} {ms['ref']:7.3f} {ms['fast']:7.3f} "
                f"{rw['ref']:6.2f}x {rw['fast']:7.2f}x {rc['fast']:11.2f}x  {fc.reuse_proven}"
                + (f"  MISMATCHES={r['mismatches']}" if r["mismatches"] else "")
            )
        out["families"][fam] = fam_out
    path = write_result("analysis_cost", out)
    print(f"wrote {path}")
    bad = sum(s["mismatches"] for f in out["families"].values() for s in f["shapes"].values())
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
