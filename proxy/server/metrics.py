"""Every islwatch metric, built by one function against an injected registry (a fresh one per test), and the
only code that changes them: the handler, the pool and the admin app call the `Metrics` methods below.

Names follow https://prometheus.io/docs/practices/naming/ (`_total` counters, base units, `_seconds`).
Label values are bounded: models are configured names or "default"/"other"/"none", endpoints one of five,
reasons and causes fixed sets. Ops dashboards and alerts are built on these names: do not rename.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from proxy.core.diagnose import with_server_parity
from proxy.server.problems import ProblemLog
from proxy.server.records import AnalysisOutcome, TokenizerReport

log = logging.getLogger("islwatch.metrics")

# 1-2-5 steps from 1 to 1M tokens.
ISL_BUCKETS = tuple(float(m * 10**e) for e in range(7) for m in (1, 2, 5) if m * 10**e <= 1_000_000)
# server − expected: one bucket per token from −10 to +10 (the signatures of BOS, headers, system
# prompts live there), wider beyond.
DRIFT_BUCKETS = (
    -1000.0, -100.0, -50.0, -20.0,
    *(float(i) for i in range(-10, 11)),
    20.0, 50.0, 100.0, 1000.0,
)  # fmt: skip
ANALYSIS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)

MATCH_RESULTS = ("exact", "mismatch", "no_server_count", "no_template")
BAD_REQUEST_REASONS = (
    "invalid_json",
    "not_a_request",
    "body_too_large",
    "non_utf8",
    "wrong_content_type",
    "unknown_model",
)
UPSTREAM_ERROR_KINDS = ("connect", "timeout", "reset", "status_5xx")


def _package_version() -> str:
    try:
        return metadata.version("islwatch")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class Metrics:
    requests: Counter
    isl_tokens: Histogram
    drift_tokens: Histogram
    match: Counter
    drift: Counter
    duplicate_bos_risk: Counter
    analysis_seconds: Histogram
    analysis_dropped: Counter
    analysis_worker_exits: Counter
    analysis_queue_depth: Gauge
    fallback: Counter
    upstream_errors: Counter
    upstream_retries: Counter
    bad_requests: Counter
    tokenizer_info: Gauge
    tokenizer_changes: Counter
    parity_ok: Gauge
    server_parity_ok: Gauge
    build_info: Gauge
    registry: CollectorRegistry
    # Labelled children by (metric, *label values): `.labels()` validates and locks on every call, and the
    # request path needs several per request. Label values are bounded (module docstring), so is this.
    _children: dict[tuple[Any, ...], Any] = field(default_factory=dict, repr=False, compare=False)
    # Per tokenizer key: the identity last loaded and the info series' labels (a reload replaces them).
    _identities: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False, compare=False)
    _info_labels: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False, compare=False)
    # Per model label: the server parity probe's verdict (absent: not probed, or the server has no /tokenize).
    server_parity: dict[str, bool] = field(default_factory=dict, repr=False, compare=False)

    def child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)` (positional, in declaration order), cached. Never for removable series."""
        key = (metric, *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    # ---- the request path ---------------------------------------------------------------------------------

    def relayed(self, model: str, endpoint: str, status: int | None) -> None:
        self.child(self.requests, model, endpoint, status_class(status)).inc()

    def bad_request(self, reason: str) -> None:
        self.child(self.bad_requests, reason).inc()

    def upstream_error(self, kind: str) -> None:
        self.child(self.upstream_errors, kind).inc()

    def upstream_retried(self) -> None:
        self.upstream_retries.inc()

    # ---- analysis -----------------------------------------------------------------------------------------

    def dropped(self, n: int = 1) -> None:
        self.analysis_dropped.inc(n)

    def worker_exited(self) -> None:
        self.analysis_worker_exits.inc()

    def analysed(self, o: AnalysisOutcome, problems: ProblemLog) -> None:
        """One analysed request (event loop thread only)."""
        self.analysis_seconds.observe(o.seconds)
        model, endpoint = o.model_label, o.endpoint
        if o.error:
            problems(
                "analysis_error", "model %s endpoint %s: %s", model, endpoint, o.error, level=logging.ERROR
            )
            return
        if o.bad_reason:
            self.bad_request(o.bad_reason)
            problems(o.bad_reason, "%s body is not a request of its endpoint (%s)", endpoint, o.detail or "-")
            return
        child = self.child
        for kind, value in (("bare", o.bare), ("templated", o.templated), ("server", o.server)):
            if value is not None:
                child(self.isl_tokens, model, endpoint, kind).observe(value)
        if o.fallback_reason:
            child(self.fallback, model, o.fallback_reason).inc()
        if o.match:
            child(self.match, model, endpoint, o.match).inc()
            if o.match == "no_server_count":
                problems(
                    "no_server_count",
                    "model %s endpoint %s: response carried no usage",
                    model,
                    endpoint,
                    level=logging.DEBUG,
                )
        if o.server is not None and o.expected is not None:
            child(self.drift_tokens, model, endpoint).observe(o.server - o.expected)
        if o.cause:
            cause = with_server_parity(o.cause, self.server_parity.get(model))
            child(self.drift, model, endpoint, cause).inc()
        if o.duplicate_bos_risk:
            child(self.duplicate_bos_risk, model, endpoint).inc()

    def tokenizers_loaded(self, reports: list[TokenizerReport]) -> None:
        """Identity, change and parity series for a (re)load; the load is logged one line per model."""
        for r in reports:
            if r.error or r.identity is None:
                log.error("tokenizer for model %s failed to load: %s", r.label, r.error)
                continue
            self._identity(r.key, r.label, r.identity)
            if r.parity_ok is not None:
                self.parity_ok.labels(model=r.label).set(1 if r.parity_ok else 0)
            log.log(
                logging.INFO if r.parity_ok is not False else logging.WARNING,
                "tokenizer for model %s: %s (template %s); %s",
                r.label,
                r.identity["name"],
                (r.identity["template_sha256"] or "none")[:12],
                r.parity_summary,
            )

    def server_probed(self, label: str, ok: bool | None) -> None:
        """The server parity probe's verdict for a model; None (unknown) removes the series."""
        if ok is None:
            if self.server_parity.pop(label, None) is not None:
                self.server_parity_ok.remove(label)
            return
        self.server_parity[label] = ok
        self.server_parity_ok.labels(model=label).set(1 if ok else 0)

    def _identity(self, key: str, label: str, ident: dict[str, Any]) -> None:
        labels = (
            label,
            str(ident["name"]),
            str(ident["revision"] or ""),
            str(ident["template_sha256"] or ""),
            str(ident["tokenizer_sha256"]),
            str(ident["transformers_version"]),
        )
        old = self._info_labels.get(key)
        if old is not None and old != labels:
            self.tokenizer_info.remove(*old)
        self.tokenizer_info.labels(*labels).set(1)
        self._info_labels[key] = labels
        previous = self._identities.get(key)
        if previous is not None and previous != ident:
            self.tokenizer_changes.labels(model=label).inc()
            log.warning("tokenizer identity changed for model %s on reload", label)
        elif previous is None:
            self.tokenizer_changes.labels(model=label)  # a zero series, so an increase() alert can fire
        self._identities[key] = ident


def build_metrics(registry: CollectorRegistry, process_metrics: bool = True) -> Metrics:
    r = registry
    metrics = Metrics(
        requests=Counter(
            "islwatch_requests", "Requests relayed", ["model", "endpoint", "status_class"], registry=r
        ),
        isl_tokens=Histogram(
            "islwatch_isl_tokens",
            "Input sequence length per request: bare text, chat-templated, and as counted by the server",
            ["model", "endpoint", "kind"],
            buckets=ISL_BUCKETS,
            registry=r,
        ),
        drift_tokens=Histogram(
            "islwatch_isl_drift_tokens",
            "Server prompt tokens minus islwatch's expected count (templated for chat)",
            ["model", "endpoint"],
            buckets=DRIFT_BUCKETS,
            registry=r,
        ),
        match=Counter(
            "islwatch_isl_match",
            "Analysed requests by whether the server count equals islwatch's expected count",
            ["model", "endpoint", "result"],
            registry=r,
        ),
        drift=Counter(
            "islwatch_drift", "Analysed requests by drift cause", ["model", "endpoint", "cause"], registry=r
        ),
        duplicate_bos_risk=Counter(
            "islwatch_duplicate_bos_risk",
            "Completions prompts that already start with the BOS token's text",
            ["model", "endpoint"],
            registry=r,
        ),
        analysis_seconds=Histogram(
            "islwatch_analysis_seconds",
            "Worker time to analyse one request",
            buckets=ANALYSIS_BUCKETS,
            registry=r,
        ),
        analysis_dropped=Counter(
            "islwatch_analysis_dropped", "Analyses dropped because the analysis queue was full", registry=r
        ),
        analysis_worker_exits=Counter(
            "islwatch_analysis_worker_exits",
            "Analysis worker processes that exited unexpectedly (each is restarted)",
            registry=r,
        ),
        analysis_queue_depth=Gauge(
            "islwatch_analysis_queue_depth", "Analyses submitted and not yet finished", registry=r
        ),
        fallback=Counter(
            "islwatch_fallback",
            "Requests counted without the chat template (no template, template error, ...)",
            ["model", "reason"],
            registry=r,
        ),
        upstream_errors=Counter(
            "islwatch_upstream_errors", "Upstream failures by kind", ["kind"], registry=r
        ),
        upstream_retries=Counter(
            "islwatch_upstream_retries",
            "Requests sent again on a new connection: the reused one was closed before any response byte",
            registry=r,
        ),
        bad_requests=Counter(
            "islwatch_bad_requests", "Requests islwatch could not analyse, by reason", ["reason"], registry=r
        ),
        tokenizer_info=Gauge(
            "islwatch_tokenizer_info",
            "Loaded tokenizer identity (value 1)",
            ["model", "tokenizer", "revision", "template_sha256", "tokenizer_sha256", "transformers_version"],
            registry=r,
        ),
        tokenizer_changes=Counter(
            "islwatch_tokenizer_changes",
            "Reloads that changed a model's tokenizer or template identity",
            ["model"],
            registry=r,
        ),
        parity_ok=Gauge(
            "islwatch_parity_ok",
            "Startup serialization self-check passed (1) or failed (0)",
            ["model"],
            registry=r,
        ),
        server_parity_ok=Gauge(
            "islwatch_server_parity_ok",
            "The server's /tokenize gave islwatch's ids for every probe text (1) or not (0); absent: unknown",
            ["model"],
            registry=r,
        ),
        build_info=Gauge("islwatch_build_info", "islwatch version (value 1)", ["version"], registry=r),
        registry=r,
    )
    metrics.build_info.labels(version=_package_version()).set(1)
    # Pre-create the unlabelled-by-request series so dashboards see zeros, not gaps.
    for reason in BAD_REQUEST_REASONS:
        metrics.bad_requests.labels(reason=reason)
    for kind in UPSTREAM_ERROR_KINDS:
        metrics.upstream_errors.labels(kind=kind)
    if process_metrics:
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
    return metrics


def status_class(status: int | None) -> str:
    """`2xx`...`5xx`, or `error` when no upstream response reached the client (the proxy's own 502/504)."""
    return f"{status // 100}xx" if status is not None and 100 <= status < 600 else "error"
