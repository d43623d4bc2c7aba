"""An analysis worker process: `python -m proxy.server.worker JOB_FD OUT_FD DESCRIBE SPEC_JSON`.

Started by proxy/server/processes.py. Job frames arrive on one pipe, outcome lines leave on another (the
protocol is in frames.py); end of input (the parent closed the pipe, or died) ends the worker, so a worker
never outlives its proxy.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
from typing import BinaryIO

import orjson

from proxy.runtime.heap import freeze_startup_heap
from proxy.server.analyzer import AnalysisSpec, Analyzer
from proxy.server.frames import FRAME_HEAD, READY, decode_job, encode_outcome
from proxy.server.problems import traceback_line
from proxy.server.records import NONE_LABEL, OTHER_ENDPOINT, AnalysisOutcome


def serve_pipe(analyzer: Analyzer, jobs: BinaryIO, out: BinaryIO) -> None:
    """Analyse job frames from `jobs` until EOF (the parent closed the pipe, or died), one outcome line each."""
    head_size = FRAME_HEAD.size
    while True:
        head = jobs.read(head_size)
        if len(head) < head_size:
            return
        header_len, payload_len = FRAME_HEAD.unpack(head)
        header = jobs.read(header_len)
        payload = jobs.read(payload_len)
        if len(header) < header_len or len(payload) < payload_len:
            return
        try:
            job = decode_job(header, payload)
        except Exception as exc:  # a framing bug must not kill the worker silently; the parent counts it
            bad = AnalysisOutcome(OTHER_ENDPOINT, NONE_LABEL, 0.0, error="bad frame", error_stage="frame",
                                  detail=traceback_line(exc))  # fmt: skip
            out.write(encode_outcome(bad))
            out.flush()
            continue
        out.write(encode_outcome(analyzer.analyze(job)))
        out.flush()


def _release_freed_heap() -> None:
    """Give the heap that loading freed back to the OS: copying a tokenizer through its JSON (fast.py's
    private backend) leaves ~150 MB of freed, fragmented glibc heap with Llama-3 that free() keeps mapped;
    malloc_trim(0) returns every free page (glibc malloc/malloc.c: mtrim walks all arenas)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def main(argv: list[str]) -> int:
    job_fd, out_fd, describe, spec_json = int(argv[0]), int(argv[1]), argv[2] == "1", argv[3]
    # Ctrl-C reaches the whole process group: the parent decides when workers stop (by closing the pipe).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # BrokenPipeError: the parent went away, there is nothing left to report to.
    with (
        contextlib.suppress(BrokenPipeError),
        os.fdopen(job_fd, "rb", buffering=1 << 16) as jobs,
        os.fdopen(out_fd, "wb") as out,
    ):
        analyzer = Analyzer.load(AnalysisSpec.from_json(spec_json))
        reports = [r.as_row() for r in analyzer.describe()] if describe else None
        _release_freed_heap()  # after the load and its self-check, which free what they built
        freeze_startup_heap()  # the loaded tokenizers are never walked by a collection again (heap.py)
        if analyzer.spec.nice:
            os.nice(analyzer.spec.nice)  # after loading: a reload is not slowed, the analyses yield
        out.write(orjson.dumps((READY, reports)) + b"\n")
        out.flush()
        serve_pipe(analyzer, jobs, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
