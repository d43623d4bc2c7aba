"""`python -m bench`: run every benchmark, then rewrite bench/LATEST.md from the results.

Usage: python -m bench [--quick] [--only analysis_cost,proxy_overhead,loadgen_capacity] [--report-only]
Each benchmark also runs alone: python -m bench.<name> --help.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from bench.report import write_latest

BENCHES = ("analysis_cost", "proxy_overhead", "loadgen_capacity")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="smoke-sized runs (numbers are not for LATEST.md)")
    p.add_argument("--only", default=",".join(BENCHES))
    p.add_argument("--report-only", action="store_true", help="only rewrite LATEST.md from existing results")
    args = p.parse_args(argv)
    failed = []
    if not args.report_only:
        for name in [n for n in args.only.split(",") if n]:
            if name not in BENCHES:
                p.error(f"unknown benchmark {name!r}; known: {', '.join(BENCHES)}")
            print(f"== {name}", flush=True)
            # Each in a fresh interpreter: no tokenizer threads or caches carried from one to the next.
            cmd = [sys.executable, "-m", f"bench.{name}", *(["--quick"] if args.quick else [])]
            if subprocess.run(cmd, check=False).returncode:
                failed.append(name)
    if not args.quick:
        print(f"wrote {write_latest()}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
