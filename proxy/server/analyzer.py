"""The analysis of one request, as run inside an analysis worker (a process, or a thread).

`Analyzer.load(spec)` loads every tokenizer once (with its fast encoder and drift profile);
`analyzer.analyze(job)` turns one `AnalysisJob` into an `AnalysisOutcome`: count the request as the
configured server flavor would, read the server's count from its usage, compare, name the drift cause,
optionally dump a mismatch. No aiohttp and no prometheus_client here: Prometheus counters live in the main
process, which applies the outcome (`Metrics.analysed`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.count import HISTORY_ON_SERVER, INVALID_BODY, NO_TEMPLATE, SERVER_REFUSES, CountResult
from proxy.core.diagnose import DriftProfile, classify
from proxy.core.images import COUNTED, UNMODELED, ImageModel
from proxy.core.model import ServedModel, load_served_model, profile_of
from proxy.core.parity_gate import startup_self_check
from proxy.core.probe_set import chat_probe, our_ids, probes
from proxy.core.renderers import JINJA
from proxy.core.renderers.mistral import MistralLoadError
from proxy.core.tokenizer import TokenizerLoadError
from proxy.core.vision import image_model_for
from proxy.server.dump import MismatchDumper
from proxy.server.problems import traceback_line

# AnalysisSpec lives in records.py so the event-loop process can build one without importing transformers.
from proxy.server.records import (
    DEFAULT_KEY,
    DEFAULT_LABEL,
    AnalysisJob,
    AnalysisOutcome,
    AnalysisSpec,
    TokenizerReport,
)

log = logging.getLogger("islwatch.analysis")

# Fallback reasons that mean "counted without the template" (exported in islwatch_fallback_total).
_FALLBACKS_COUNTED = ("no_template", "template_error")


@dataclass
class _Stage:
    """Where `Analyzer._analyze` is, for the error count when it raises (metrics.ANALYSIS_STAGES)."""

    name: str = "count"


@dataclass(frozen=True)
class _Entry:
    model: ServedModel  # the tokenizer, templates and renderer as the flavor's server runs them
    profile: DriftProfile


def _label(key: str) -> str:
    return DEFAULT_LABEL if key == DEFAULT_KEY else key


def _images_fields(result: CountResult) -> dict[str, Any]:
    """Image outcomes for the metrics; a request counted without its template had no image counted."""
    n = result.media_parts.get("image", 0)
    if not n:
        return {}
    images = result.image_outcomes or {UNMODELED: n}
    tokens = sum(result.image_tokens) if images.get(COUNTED) == n else None
    return {"images": images, "image_tokens": tokens}


def _match(result: CountResult, server: int | None) -> str:
    if result.fallback_reason == NO_TEMPLATE:
        return "no_template"
    if server is None or result.expected_server is None:
        return "no_server_count"
    return "exact" if server == result.expected_server else "mismatch"


class Analyzer:
    def __init__(self, spec: AnalysisSpec) -> None:
        self.spec = spec
        self.entries: dict[str, _Entry] = {}
        self.errors: dict[str, str] = {}
        self._dumper = MismatchDumper(spec.dump_dir, spec.dump_max) if spec.dump_dir else None

    @classmethod
    def load(cls, spec: AnalysisSpec) -> Analyzer:
        """Load every tokenizer; a failure is recorded per model (reported by `describe`), never raised."""
        state = cls(spec)
        for key, tok_spec in spec.tokenizers:
            try:
                model = load_served_model(
                    tok_spec,
                    spec.server_flavor,
                    spec.settings(),
                    chat_template_file=spec.chat_template,
                    trust_remote_code=spec.trust_remote_code,
                    images=state._images,
                )
            except (TokenizerLoadError, MistralLoadError) as exc:
                state.errors[key] = str(exc)
                continue
            state.entries[key] = _Entry(model, profile_of(model))
        return state

    def _images(self, tok: Any) -> ImageModel | None:
        spec = self.spec
        return image_model_for(
            spec.server_flavor, tok, spec.mm_processor_kwargs, spec.trust_request_mm_kwargs
        )

    def describe(self) -> list[TokenizerReport]:
        """Identities and the parity self-check, once per load (run by one worker)."""
        reports = []
        for key, _ in self.spec.tokenizers:
            if key in self.errors:
                reports.append(TokenizerReport(key, _label(key), None, None, "", error=self.errors[key]))
                continue
            model = self.entries[key].model
            if model.tokenizer is None:  # mistral-common alone: no transformers paths to compare, no probe
                reports.append(TokenizerReport(key, _label(key), model.describe(), None, "not checked"))
                continue
            check = startup_self_check(model.tokenizer)
            probe_set = probes(model.tokenizer)
            # Harmony and mistral-common render no template: /tokenize's chat would not be islwatch's render
            chat = None
            if model.renderer == JINJA:
                chat = chat_probe(model.tokenizer, model.settings.default_chat_template_kwargs)
            reports.append(
                TokenizerReport(
                    key,
                    _label(key),
                    model.describe(),
                    check.ok,
                    check.summary,
                    probes=[[p.name, p.text] for p in probe_set],
                    probe_ids=our_ids(model.tokenizer, probe_set),
                    chat_probe=None if chat is None else [chat.messages, chat.ours, chat.variants],
                    fast_path_fallbacks=sorted(
                        {
                            *getattr(model.encoder, "fallbacks", ()),
                            *getattr(model.processor_encoder, "fallbacks", ()),
                        }
                    ),
                )
            )
        return reports

    def analyze(self, job: AnalysisJob) -> AnalysisOutcome:
        """Never raises: an internal error becomes an outcome with `error` set."""
        start = time.perf_counter()
        stage = _Stage()
        try:
            fields = self._analyze(job, stage)
        except Exception as exc:  # the boundary that must never fail: an islwatch bug, never data
            # Counted in islwatch_analysis_errors_total{stage} and logged (throttled) by the main process; the
            # frames say where, the message is left out (it may quote the request).
            fields = {"error": "internal error", "error_stage": stage.name, "detail": traceback_line(exc)}
        return AnalysisOutcome(
            endpoint=job.endpoint,
            model_label=job.model_label,
            seconds=time.perf_counter() - start,
            memo_key=job.memo_key,
            **fields,
        )

    def _analyze(self, job: AnalysisJob, stage: _Stage) -> dict[str, Any]:
        entry = self.entries.get(job.tokenizer_key)
        if entry is None:
            return {"error": "tokenizer not loaded"}
        body = job.parsed if job.parsed is not None else orjson.loads(job.body)
        result = entry.model.count(job.endpoint, body, job.streamed)
        if result.fallback_reason == INVALID_BODY:
            return {"bad_reason": "not_a_request", "detail": result.detail}
        if result.fallback_reason == SERVER_REFUSES:  # the server answers 400: nothing to compare
            return {"bad_reason": "server_refuses", "detail": result.detail}
        if result.fallback_reason == HISTORY_ON_SERVER:  # the prompt is the server's: not drift, not counted
            return {"bad_reason": HISTORY_ON_SERVER, "detail": result.detail}
        stage.name = "usage"
        usage = job.usage()
        server = job.server_count(usage)
        match = _match(result, server)
        stage.name = "classify"
        cause = classify(result, server, entry.profile) if server is not None else None
        if match == "mismatch" and self._dumper is not None:
            stage.name = "dump"
            self._dumper.write(self._dump_record(job, body, result, server, cause, entry))
        return {
            "bare": result.bare,
            "templated": result.templated,
            "expected": result.expected_server,
            "server": server,
            "match": match,
            "cause": cause,
            "fallback_reason": result.fallback_reason
            if result.fallback_reason in _FALLBACKS_COUNTED
            else None,
            "detail": result.detail,
            "duplicate_bos_risk": result.bos_prefixed_prompt,
            **_images_fields(result),
            "output_tokens": usage.output_tokens if usage else None,
            "cached_tokens": usage.cached_tokens if usage else None,
            "reasoning_tokens": usage.reasoning_tokens if usage else None,
        }

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
            "tokenizer": entry.model.describe(),
            "request": body,
        }
