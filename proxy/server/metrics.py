"""The only code that changes islwatch's metrics: the handler, the pool and the admin app call the `Metrics`
methods below. The families themselves (names, help, labels, buckets) are in `metric_families.py`, built by
`build_metrics` against an injected registry (a fresh one per test).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from proxy.core.causes import with_server_parity
from proxy.core.usage import Usage
from proxy.server.metric_families import (
    ADMIN_REFUSALS,
    ANALYSIS_STAGES,
    BAD_REQUEST_REASONS,
    BODY_BUDGET_EVENTS,
    CUT_REASONS,
    DISCONNECT_STAGES,
    ENGINE_SCRAPE_RESULTS,
    INJECTION_RESULTS,
    UPSTREAM_ERROR_KINDS,
    USAGE_FIELDS,
    families,
)
from proxy.server.problems import ProblemLog
from proxy.server.records import AnalysisOutcome, TokenizerReport

log = logging.getLogger("islwatch.metrics")
# The fast-path fallback reasons already logged by this process (tokenizers_loaded): one line each.
_FALLBACKS_LOGGED: set[str] = set()


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
    analysis_reused: Counter
    analysis_dropped: Counter
    analysis_skipped: Counter
    analysis_worker_exits: Counter
    analysis_queue_depth: Gauge
    analysis_workers_live: Gauge
    fallback: Counter
    upstream_errors: Counter
    upstream_retries: Counter
    stream_usage_injections: Counter
    bad_requests: Counter
    analysis_errors: Counter
    fast_path_fallbacks: Counter
    proxy_errors: Counter
    client_connections: Gauge
    connections_cut: Counter
    client_disconnects: Counter
    admin_refusals: Counter
    body_budget_bytes: Gauge
    body_budget_events: Counter
    tokenizer_info: Gauge
    tokenizer_changes: Counter
    parity_ok: Gauge
    server_parity_ok: Gauge
    build_info: Gauge
    dependency_info: Gauge
    output_tokens: Histogram
    cached_prompt_tokens: Histogram
    reasoning_tokens: Histogram
    usage_fields: Counter
    engine_tokens: Counter
    engine_scrapes: Counter
    image_tokens: Histogram
    images_per_request: Histogram
    images: Counter
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

    def injection(self, result: str) -> None:
        """One INJECTION_RESULTS outcome of --inject-stream-usage."""
        self.child(self.stream_usage_injections, result).inc()

    def upstream_retried(self) -> None:
        self.upstream_retries.inc()

    def connection_cut(self, reason: str) -> None:
        self.child(self.connections_cut, reason).inc()

    def body_budget(self, event: str) -> None:
        self.child(self.body_budget_events, event).inc()

    def admin_refused(self, reason: str) -> None:
        self.child(self.admin_refusals, reason).inc()

    def client_disconnected(self, stage: str) -> None:
        self.child(self.client_disconnects, stage).inc()

    def proxy_error(self) -> None:
        self.proxy_errors.inc()

    # ---- analysis -----------------------------------------------------------------------------------------

    def dropped(self, n: int = 1) -> None:
        self.analysis_dropped.inc(n)

    def skipped(self, model: str, endpoint: str) -> None:
        """A request the sample rate left out: relayed, not analysed (not a drop: nothing was lost)."""
        self.child(self.analysis_skipped, model, endpoint).inc()

    def worker_exited(self) -> None:
        self.analysis_worker_exits.inc()

    def analysed(self, o: AnalysisOutcome, problems: ProblemLog) -> Plan | None:
        """One request a worker analysed (event loop thread only). Returns the plan of the series its outcome
        set, for the memo to apply again (`reapplied`); None for an outcome that counted nothing."""
        self.analysis_seconds.observe(o.seconds)
        model, endpoint = o.model_label, o.endpoint
        if o.error:
            if o.error_stage:  # an islwatch bug: counted, and one line with its frames (detail)
                self.child(self.analysis_errors, o.error_stage).inc()
            problems(
                f"analysis_error_{o.error_stage or 'state'}", "model %s endpoint %s: %s (%s)", model, endpoint,
                o.error, o.detail or "-", level=logging.ERROR,
            )  # fmt: skip
            return None
        if o.bad_reason:
            self.bad_request(o.bad_reason)
            what = {
                "server_refuses": "the server would refuse",
                "history_on_server": "the conversation is held by the server",
            }.get(o.bad_reason, "not a request of its endpoint")
            problems(o.bad_reason, "%s body: %s (%s)", endpoint, what, o.detail or "-")
            return None
        plan = self.plan(o)
        self._apply(o, plan, (o.server, o.output_tokens, o.cached_tokens, o.reasoning_tokens), problems)
        return plan

    def reapplied(self, o: AnalysisOutcome, plan: Plan, usage: Usage | None, problems: ProblemLog) -> Plan:
        """A memo hit (memo.py): the kept outcome `o` again, with this answer's usage; the same series as
        `analysed` of that outcome would set (tests/server/test_outcome_memo.py compares the two proxies)."""
        if plan.server_parity is not self.server_parity.get(o.model_label):  # the cause label changed
            plan = self.plan(o)
        self.analysis_reused.inc()
        values = (o.server, None, None, None) if usage is None else (
            o.server, usage.output_tokens, usage.cached_tokens, usage.reasoning_tokens
        )  # fmt: skip
        self._apply(o, plan, values, problems)
        return plan

    def _apply(
        self, o: AnalysisOutcome, plan: Plan, usage: tuple[int | None, ...], problems: ProblemLog
    ) -> None:
        """The plan's series, the answer's usage (prompt, output, cached, reasoning tokens), the outcome's
        log lines: what `analysed` and `reapplied` both do."""
        for update, value in plan.updates:
            update(value)
        self._usage(o.model_label, o.endpoint, usage)
        _problem_lines(o, problems)

    def plan(self, o: AnalysisOutcome) -> Plan:
        """The updates a clean outcome makes to the series it alone decides (all but the answer's usage):
        labelled children resolved once, so applying it again is one call per series."""
        model, endpoint, child = o.model_label, o.endpoint, self.child
        updates: list[tuple[Callable[[float], None], float]] = []
        for kind, value in (("bare", o.bare), ("templated", o.templated), ("server", o.server)):
            if value is not None:
                updates.append((child(self.isl_tokens, model, endpoint, kind).observe, value))
        if o.images:
            updates.append((child(self.images_per_request, model, endpoint).observe, sum(o.images.values())))
            updates += [(child(self.images, model, endpoint, r).inc, n) for r, n in o.images.items()]
            if o.image_tokens is not None:
                updates.append((child(self.image_tokens, model, endpoint).observe, o.image_tokens))
        if o.fallback_reason:
            updates.append((child(self.fallback, model, o.fallback_reason).inc, 1))
        if o.match:
            updates.append((child(self.match, model, endpoint, o.match).inc, 1))
        if o.server is not None and o.expected is not None:
            updates.append((child(self.drift_tokens, model, endpoint).observe, o.server - o.expected))
        parity = self.server_parity.get(model)
        if o.cause:
            updates.append((child(self.drift, model, endpoint, with_server_parity(o.cause, parity)).inc, 1))
        if o.duplicate_bos_risk:
            updates.append((child(self.duplicate_bos_risk, model, endpoint).inc, 1))
        return Plan(tuple(updates), parity)

    def _usage(self, model: str, endpoint: str, values: tuple[int | None, ...]) -> None:
        """The rest of the answer's usage (prompt, output, cached, reasoning tokens), and which of its fields
        the server reported at all."""
        histograms = (None, self.output_tokens, self.cached_prompt_tokens, self.reasoning_tokens)
        for field_name, histogram, value in zip(USAGE_FIELDS, histograms, values, strict=True):
            self.child(self.usage_fields, model, field_name, "false" if value is None else "true").inc()
            if histogram is not None and value is not None:
                self.child(histogram, model, endpoint).observe(value)

    # ---- the engine's own counters (engine_metrics.py) ----------------------------------------------------

    def engine_counted(self, kind: str, engine: str, delta: float) -> None:
        """Tokens the engine's own counters added since the last scrape (0 creates the series)."""
        self.child(self.engine_tokens, kind, engine).inc(delta)

    def engine_scraped(self, result: str | None) -> None:
        """One scrape of the engine's /metrics; None pre-creates every result series (the scraper starts)."""
        for name in ENGINE_SCRAPE_RESULTS if result is None else (result,):
            self.child(self.engine_scrapes, name).inc(0 if result is None else 1)

    def tokenizers_loaded(self, reports: list[TokenizerReport]) -> None:
        """Identity, change and parity series for a (re)load; the load is logged one line per model."""
        for r in reports:
            if r.error or r.identity is None:
                log.error("tokenizer for model %s failed to load: %s", r.label, r.error)
                continue
            self._identity(r.key, r.label, r.identity)
            for reason in r.fast_path_fallbacks or ():
                self.fast_path_fallbacks.labels(reason=reason).inc()
                if reason not in _FALLBACKS_LOGGED:  # once per reason and process: the count says how often
                    _FALLBACKS_LOGGED.add(reason)
                    log.warning(
                        "a fast-path shortcut is off (%s): analysis is slower, counts unchanged", reason
                    )
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
            str(ident.get("tokenizer_class") or ""),
            str(ident.get("renderer") or ""),
        )
        old = self._info_labels.get(key)
        if old is not None and old != labels:
            self.tokenizer_info.remove(*old)
        self.tokenizer_info.labels(*labels).set(1)
        self._info_labels[key] = labels
        previous = self._identities.get(key)
        if previous is not None and previous != ident:
            self.tokenizer_changes.labels(model=label).inc()
            log.warning("tokenizer identity changed for model %s (a reload or a worker restart)", label)
        elif previous is None:
            self.tokenizer_changes.labels(model=label)  # a zero series, so an increase() alert can fire
        self._identities[key] = ident


def build_metrics(registry: CollectorRegistry, process_metrics: bool = True) -> Metrics:
    r = registry
    metrics = Metrics(**families(r), registry=r)
    metrics.build_info.labels(version=_package_version()).set(1)
    # Pre-create the unlabelled-by-request series so dashboards see zeros, not gaps.
    for reason in BAD_REQUEST_REASONS:
        metrics.bad_requests.labels(reason=reason)
    for kind in UPSTREAM_ERROR_KINDS:
        metrics.upstream_errors.labels(kind=kind)
    for reason in CUT_REASONS:
        metrics.connections_cut.labels(reason=reason)
    for stage in DISCONNECT_STAGES:
        metrics.client_disconnects.labels(stage=stage)
    for reason in ADMIN_REFUSALS:
        metrics.admin_refusals.labels(reason=reason)
    for event in BODY_BUDGET_EVENTS:
        metrics.body_budget_events.labels(event=event)
    for result in INJECTION_RESULTS:
        metrics.stream_usage_injections.labels(result=result)
    for stage in ANALYSIS_STAGES:
        metrics.analysis_errors.labels(stage=stage)
    if process_metrics:
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
    return metrics


@dataclass(frozen=True)
class Plan:
    """`Metrics.plan` of one outcome: (update, value) pairs, and the server parity verdict its drift cause
    label was chosen with (a new verdict asks for a new plan)."""

    updates: tuple[tuple[Callable[[float], None], float], ...]
    server_parity: bool | None


def _problem_lines(o: AnalysisOutcome, problems: ProblemLog) -> None:
    if o.match == "no_server_count":
        problems("no_server_count", "model %s endpoint %s: response carried no usage", o.model_label,
                 o.endpoint, level=logging.DEBUG)  # fmt: skip
    if o.images and o.images.get("unreadable"):
        problems("image_unreadable", "model %s endpoint %s: an image's size could not be read (corrupt, "
                 "unsupported format or too large): counted as media", o.model_label, o.endpoint)  # fmt: skip


def status_class(status: int | None) -> str:
    """`2xx`...`5xx`, or `error` when no upstream response reached the client (the proxy's own 502/504)."""
    return f"{status // 100}xx" if status is not None and 100 <= status < 600 else "error"
