"""The exactness grid of issue 5 (ISL x turns x cache-bust x shared system prompt), pure: no server.

Shared by the exactness tests and by `python -m tests.loadgen.grid` which prints exact-hit rates.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from loadgen.config import LoadgenConfig
from loadgen.workload.conversations import Request, Workload
from loadgen.workload.markers import CacheBust
from proxy.core.count import count_request

ISLS = (16, 128, 1000)
BIG_ISL = 8000
REPLY = "Sure. Here is a short answer, with numbers 1, 2 and 3; and a question?"
INFEASIBLE = ("below the fixed cost", "template_error")


@dataclass
class GridResult:
    built: int = 0
    exact: int = 0
    refused: list[tuple[Any, ...]] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)
    identity_failures: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.exact / self.built if self.built else 0.0


def combos() -> list[tuple[int, int, str, int]]:
    out = [
        (isl, turns, cb.value, system)
        for isl, turns, cb, with_system in itertools.product(ISLS, (1, 3), CacheBust, (False, True))
        for system in [max(isl // 4, 8) if with_system else 0]
    ]
    # 8000 is slow to tokenize three times over; sample it.
    out += [(BIG_ISL, 1, "none", 0), (BIG_ISL, 3, "first_turn_suffix", 0), (BIG_ISL, 3, "system_prefix", 512)]
    return out


def config(isl: int, turns: int, cache_bust: str, system: int) -> LoadgenConfig:
    return LoadgenConfig(
        url="http://127.0.0.1:1",
        isl=isl,
        turns=turns,
        cache_bust=cache_bust,
        shared_system_prompt_length=system,
        concurrency=1,
        request_count=1,
        run_id="grid",
    )


def templated(tok: Any, body: dict[str, Any]) -> int | None:
    return count_request(tok, "chat", body).templated


def run_conversation(tok: Any, w: Workload, cid: str, turns: int, res: GridResult) -> bool:
    """False if the first turn is infeasible for this template (refused, not sent)."""
    conv, req = w.start(cid)
    if req.error and any(s in req.error for s in INFEASIBLE):
        return False
    prev: Request | None = None
    for _ in range(turns):
        if prev is not None:
            req = w.follow_up(conv, REPLY)
        res.built += 1
        if req.error is None and req.client_isl == req.target_isl:
            res.exact += 1
        else:
            res.misses.append(f"{cid} turn {req.turn}: {req.error} ({req.client_isl} vs {req.target_isl})")
        if prev is not None and req.client_isl is not None and prev.client_isl is not None:
            # Turn k = turn k-1 + its rendered reply + ISL, the reply measured independently here.
            history = [*prev.body["messages"], {"role": "assistant", "content": REPLY}]
            with_reply = templated(tok, {"messages": history, "add_generation_prompt": False})
            assert with_reply is not None
            reply = with_reply - prev.client_isl
            if req.client_isl != prev.client_isl + reply + w.cfg.isl or req.reply_tokens != reply:
                res.identity_failures.append(f"{cid} turn {req.turn}")
        prev = req
    return True


def run_grid(tok: Any, conversations: int = 1) -> GridResult:
    res = GridResult()
    for isl, turns, cb, system in combos():
        try:
            w = Workload(tok, config(isl, turns, cb, system))
        except ValueError as exc:  # the shared system prompt itself cannot be built
            res.refused.append((isl, turns, cb, system, str(exc)))
            continue
        for i in range(conversations):
            if not run_conversation(tok, w, f"{isl}-{turns}-{cb}-{system}-{i}", turns, res):
                res.refused.append((isl, turns, cb, system))
                break
    return res


if __name__ == "__main__":  # exact-hit rates per tokenizer, for the docs
    import sys

    from tests.builders import TEMPLATES, build_tokenizer
    from tests.conftest import FAMILIES, TEST_TOKENIZERS, load_builtin, load_shared

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    toks = {f"built:{s}": build_tokenizer(s) for s in TEMPLATES}
    toks["builtin:mistral-v0.1"] = load_builtin().tokenizer
    for fam in FAMILIES:
        if (TEST_TOKENIZERS / fam).is_dir():
            toks[fam] = load_shared(fam).tokenizer
    for name, tok in toks.items():
        r = run_grid(tok, n)
        print(
            f"{name}: {r.exact}/{r.built} exact ({r.rate:.4%}), refused combos {len(r.refused)}, "
            f"identity failures {len(r.identity_failures)}",
            flush=True,
        )
