"""The analysis of one request, as run inside an analysis worker (a process, or a thread).

`WorkerState.load(spec)` loads every tokenizer once (and builds its drift profile); `state.analyze(job)`
turns one `AnalysisJob` into an `AnalysisOutcome`: count the request, read the server's count, compare,
name the drift cause, optionally dump a mismatch. No aiohttp and no prometheus_client here: metrics are
updated by the main process from the outcome, because Prometheus counters live in one process.

As a process (`python -m proxy.worker`, started by `proxy.analysis`): job frames arrive on one pipe, outcome
lines leave on another (the protocol is in `proxy.records`); end of input (the parent closed the pipe or
died) ends the worker, so a worker never outlives its proxy.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, BinaryIO

import orjson

from proxy.core.count import INVALID_BODY, NO_TEMPLATE, CountResult, count
from proxy.core.diagnose import DriftProfile, build_profile, classify
from proxy.core.fast import best_encoder
from proxy.core.flavor import flavored_tokenizer, prepare_body, reported_prompt_tokens
from proxy.core.tokenizer import LoadedTokenizer, TokenizerLoadError, load_tokenizer
from proxy.core.usage import usage_from_json_bytes
from proxy.parity.gate import startup_self_check
from proxy.server.dump import MismatchDumper
from proxy.server.records import (
    DEFAULT_KEY,
    DEFAULT_LABEL,
    FRAME_HEAD,
    NONE_LABEL,
    OTHER_ENDPOINT,
    READY,
    AnalysisJob,
    AnalysisOutcome,
    TokenizerReport,
    decode_job,
    encode_outcome,
)

log = logging.getLogger("islwatch.analysis")

# Fallback reasons that mean "counted without the template" (exported in islwatch_fallback_total).
_FALLBACKS_COUNTED = ("no_template", "template_error", "tokenizer_error")


@dataclass(frozen=True)
class AnalysisSpec:
    """What a worker needs to load its state; plain values, so it crosses to a worker process as JSON."""

    tokenizers: tuple[tuple[str, str], ...]  # (key, spec); key DEFAULT_KEY is the default tokenizer
    chat_template: str | None = None
    trust_remote_code: bool = False
    dump_dir: str | None = None
    dump_max: int = 100
    server_flavor: str = "vllm"


@dataclass(frozen=True)
class _Entry:
    loaded: LoadedTokenizer
    count: Callable[[str, Any], CountResult]
    profile: DriftProfile


def _counter(tok: Any) -> Callable[[str, Any], CountResult]:
    encoder = best_encoder(tok)  # exact by construction: each shortcut is proven on this tokenizer at load
    return lambda endpoint, body: count(encoder, endpoint, body)


def _label(key: str) -> str:
    return DEFAULT_LABEL if key == DEFAULT_KEY else key


class WorkerState:
    def __init__(self, spec: AnalysisSpec) -> None:
        self.spec = spec
        self.entries: dict[str, _Entry] = {}
        self.errors: dict[str, str] = {}
        self._dumper = MismatchDumper(spec.dump_dir, spec.dump_max) if spec.dump_dir else None

    @classmethod
    def load(cls, spec: AnalysisSpec) -> WorkerState:
        """Load every tokenizer; a failure is recorded per model (reported by `describe`), never raised."""
        state = cls(spec)
        for key, tok_spec in spec.tokenizers:
            try:
                loaded = load_tokenizer(tok_spec, None, spec.chat_template, spec.trust_remote_code)
            except TokenizerLoadError as exc:
                state.errors[key] = str(exc)
                continue
            counting_tok = flavored_tokenizer(loaded.tokenizer, spec.server_flavor)
            profile = build_profile(counting_tok)  # never raises
            state.entries[key] = _Entry(loaded, _counter(counting_tok), profile)
        return state

    def describe(self) -> list[TokenizerReport]:
        """Identities and the parity self-check, once per load (run by one worker)."""
        reports = []
        for key, _ in self.spec.tokenizers:
            if key in self.errors:
                reports.append(TokenizerReport(key, _label(key), None, None, "", error=self.errors[key]))
                continue
            entry = self.entries[key]
            check = startup_self_check(entry.loaded.tokenizer)
            ok, summary = check.ok, check.summary
            reports.append(TokenizerReport(key, _label(key), entry.loaded.identity.as_dict(), ok, summary))
        return reports

    def analyze(self, job: AnalysisJob) -> AnalysisOutcome:
        """Never raises: an internal error becomes an outcome with `error` set."""
        start = time.perf_counter()
        try:
            fields = self._analyze(job)
        except Exception as exc:  # the boundary that must never fail: counted by the caller
            fields = {"error": f"internal error: {type(exc).__name__}"}
        return AnalysisOutcome(
            endpoint=job.endpoint,
            model_label=job.model_label,
            seconds=time.perf_counter() - start,
            **fields,
        )

    def _analyze(self, job: AnalysisJob) -> dict[str, Any]:
        entry = self.entries.get(job.tokenizer_key)
        if entry is None:
            return {"error": "tokenizer not loaded"}
        body = job.parsed if job.parsed is not None else orjson.loads(job.body)
        flavor = self.spec.server_flavor
        result = entry.count(job.endpoint, prepare_body(flavor, job.endpoint, body))
        if result.fallback_reason == INVALID_BODY:
            return {"bad_reason": "not_a_request", "detail": result.detail}
        reported = reported_prompt_tokens(flavor, job.endpoint, result.prompts, job.streamed)
        if reported is not None:
            result = replace(result, expected_server=reported)
        server = job.server_tokens
        if server is None and job.response_json is not None:
            usage = usage_from_json_bytes(job.response_json)
            server = usage.input_tokens if usage is not None else None
        expected = result.expected_server
        if result.fallback_reason == NO_TEMPLATE:
            match = "no_template"
        elif server is None or expected is None:
            match = "no_server_count"
        else:
            match = "exact" if server == expected else "mismatch"
        cause = self._cause(result, server, entry.profile) if server is not None else None
        if match == "mismatch" and self._dumper is not None:
            self._dumper.write(self._dump_record(job, body, result, server, cause, entry))
        return {
            "bare": result.bare,
            "templated": result.templated,
            "expected": expected,
            "server": server,
            "match": match,
            "cause": cause,
            "fallback_reason": result.fallback_reason
            if result.fallback_reason in _FALLBACKS_COUNTED
            else None,
            "detail": result.detail,
            "duplicate_bos_risk": result.bos_prefixed_prompt,
        }

    def _cause(self, result: CountResult, server: int, profile: DriftProfile) -> str:
        return classify(result, server, profile)

    @staticmethod
    def _dump_record(
        job: AnalysisJob, body: Any, result: CountResult, server: int | None, cause: str | None, entry: _Entry
    ) -> dict[str, Any]:
        return {
            "model": job.model_label,
            "endpoint": job.endpoint,
            "server_prompt_tokens": server,
            "cause": cause,
            "count": result.as_dict(),
            "tokenizer": entry.loaded.identity.as_dict(),
            "request": body,
        }


# ---- the worker process: `python -m proxy.worker JOB_FD OUT_FD DESCRIBE SPEC_JSON` -------------------------


def spec_to_json(spec: AnalysisSpec) -> str:
    return orjson.dumps(asdict(spec)).decode()


def spec_from_json(text: str) -> AnalysisSpec:
    fields = orjson.loads(text)
    fields["tokenizers"] = tuple((str(k), str(v)) for k, v in fields["tokenizers"])
    return AnalysisSpec(**fields)


def serve_pipe(state: WorkerState, jobs: BinaryIO, out: BinaryIO) -> None:
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
            job_error = AnalysisOutcome(
                OTHER_ENDPOINT, NONE_LABEL, 0.0, error=f"bad frame: {type(exc).__name__}"
            )
            out.write(encode_outcome(job_error))
            out.flush()
            continue
        out.write(encode_outcome(state.analyze(job)))
        out.flush()


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
        state = WorkerState.load(spec_from_json(spec_json))
        reports = [r.as_row() for r in state.describe()] if describe else None
        out.write(orjson.dumps((READY, reports)) + b"\n")
        out.flush()
        serve_pipe(state, jobs, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
