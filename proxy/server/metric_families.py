"""The metric families: each name, help text, label names and buckets, in one place (the catalog that
README "Metrics", the dashboard and the alert rules are held to). `metrics.py` holds the code that changes them.

Names follow https://prometheus.io/docs/practices/naming/ (`_total` counters, base units, `_seconds`).
Label values are bounded: models are configured names or "default"/"other"/"none", endpoints one of five,
reasons and causes fixed sets (below). Ops dashboards and alerts are built on these names: do not rename.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from proxy.core.fallbacks import FALLBACK_REASONS

# 1-2-5 steps from 1 to 1M tokens.
ISL_BUCKETS = tuple(float(m * 10**e) for e in range(7) for m in (1, 2, 5) if m * 10**e <= 1_000_000)
IMAGES_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 8.0, 10.0, 20.0, 50.0, 100.0)
# server − expected: one bucket per token from −10 to +10 (the signatures of BOS, headers, system
# prompts live there), wider beyond.
DRIFT_BUCKETS = (
    -1000.0, -100.0, -50.0, -20.0,
    *(float(i) for i in range(-10, 11)),
    20.0, 50.0, 100.0, 1000.0,
)  # fmt: skip
ANALYSIS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)

# islwatch_usage_fields_total{field}: the usage fields each answer did or did not report (README, "Usage").
USAGE_FIELDS = ("prompt_tokens", "output_tokens", "cached_prompt_tokens", "reasoning_tokens")
ENGINE_SCRAPE_RESULTS = ("ok", "error", "no_counters")
BAD_REQUEST_REASONS = (
    "invalid_json",
    "not_a_request",
    "server_refuses",  # a request the server's own request path answers 400 (core.messages.ServerRefuses)
    "history_on_server",  # its prompt is held by the server (`previous_response_id`): it cannot be counted
    "body_too_large",
    "non_utf8",
    "wrong_content_type",
    "unknown_model",
    "malformed_head",  # the HTTP request head does not parse: answered 400 by the proxy (guard.ServerLog)
    "malformed_body",  # the body's framing breaks (a chunk size that is not hex...): connection closed
)
UPSTREAM_ERROR_KINDS = ("connect", "timeout", "reset", "head_too_large", "status_5xx")
# --inject-stream-usage, per analysed streaming request that did not ask for usage (inspect.py, relay.py):
# asked upstream and the usage-only event taken out again, asked but none came back, asked but the answer
# came compressed (relayed as sent: the proxy cannot edit it), or not asked because the client accepts only
# compressed answers or its body already holds stream_options (its stream could not be restored exactly).
INJECTION_RESULTS = ("stripped", "not_found", "compressed", "skipped_encoding", "skipped_options")
# Client connections the proxy closed (proxy/server/guard.py).
CUT_REASONS = ("header_timeout", "body_timeout", "evicted", "connection_cap")
# Requests past --max-inflight-body-bytes (budget.py): each waited; refused after the wait (503).
BODY_BUDGET_EVENTS = ("waited", "refused")
# Admin requests refused (exposition.AdminGate): too many in flight (503), no valid bearer token (401).
ADMIN_REFUSALS = ("busy", "unauthorized")
# Requests whose client went away (handler.py): while its body was read, before the upstream's answer
# began, or while the answer was relayed.
DISCONNECT_STAGES = ("request", "upstream", "response")
# Why a fast-path shortcut is off for a tokenizer (proxy/core/fast.py).
FAST_PATH_FALLBACK_REASONS = FALLBACK_REASONS
# Where an analysis raised: an islwatch bug, never data (proxy/server/analyzer.py).
ANALYSIS_STAGES = ("count", "usage", "classify", "dump", "frame")


def families(r: CollectorRegistry) -> dict[str, Any]:
    """Every family, registered in `r`, by its `Metrics` field name."""
    return {**_traffic(r), **_counts(r), **_analysis(r), **_identity(r), **_bill(r)}


def _traffic(r: CollectorRegistry) -> dict[str, Any]:
    """The request path: what was relayed, refused, cut or failed."""
    return dict(
        requests=Counter(
            "islwatch_requests", "Requests relayed", ["model", "endpoint", "status_class"], registry=r
        ),
        bad_requests=Counter(
            "islwatch_bad_requests",
            "Requests islwatch could not analyse (malformed ones are not relayed either), by reason",
            ["reason"],
            registry=r,
        ),
        upstream_errors=Counter(
            "islwatch_upstream_errors", "Upstream failures by kind", ["kind"], registry=r
        ),
        stream_usage_injections=Counter(
            "islwatch_stream_usage_injections",
            "Streams --inject-stream-usage asked usage for (or left alone), by result",
            ["result"],
            registry=r,
        ),
        upstream_retries=Counter(
            "islwatch_upstream_retries",
            "Requests sent again on a new connection: the reused one was closed before any response byte",
            registry=r,
        ),
        proxy_errors=Counter(
            "islwatch_proxy_errors", "Requests whose handler raised (an islwatch bug): 500", registry=r
        ),
        client_connections=Gauge(
            "islwatch_client_connections", "Client connections open on the traffic port", registry=r
        ),
        connections_cut=Counter(
            "islwatch_client_connections_cut",
            "Client connections the proxy closed: a head or body too slow, or over max_connections",
            ["reason"],
            registry=r,
        ),
        body_budget_bytes=Gauge(
            "islwatch_inflight_body_bytes",
            "Request body bytes held at once (declared lengths), against max_inflight_body_bytes",
            registry=r,
        ),
        body_budget_events=Counter(
            "islwatch_body_budget",
            "Requests past max_inflight_body_bytes: waited for room, or refused with a 503 after the wait",
            ["event"],
            registry=r,
        ),
        admin_refusals=Counter(
            "islwatch_admin_requests_refused",
            "Admin port requests refused: busy (admin_max_requests in flight, 503) or unauthorized (401)",
            ["reason"],
            registry=r,
        ),
        client_disconnects=Counter(
            "islwatch_client_disconnects",
            "Requests whose client went away before its answer ended, by stage (request, upstream, response)",
            ["stage"],
            registry=r,
        ),
    )


def _counts(r: CollectorRegistry) -> dict[str, Any]:
    """The counts themselves: ISL by kind, drift and its causes, images."""
    return dict(
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
        fallback=Counter(
            "islwatch_fallback",
            "Requests counted without the chat template (no template, template error, ...)",
            ["model", "reason"],
            registry=r,
        ),
        image_tokens=_per_request(
            "islwatch_image_tokens", "Tokens the server puts in place of a request's images (all counted)", r
        ),
        images_per_request=Histogram(
            "islwatch_images_per_request",
            "Image parts per request with images",
            ["model", "endpoint"],
            buckets=IMAGES_BUCKETS,
            registry=r,
        ),
        images=Counter(
            "islwatch_images",
            "Image parts by what islwatch made of them: counted, url, unreadable, unmodeled",
            ["model", "endpoint", "result"],
            registry=r,
        ),
    )


def _analysis(r: CollectorRegistry) -> dict[str, Any]:
    """The analysis pool: its time, drops, exits, queue, live workers and its own errors."""
    return dict(
        analysis_seconds=Histogram(
            "islwatch_analysis_seconds",
            "Worker time to analyse one request",
            buckets=ANALYSIS_BUCKETS,
            registry=r,
        ),
        analysis_reused=Counter(
            "islwatch_analysis_reused",
            "Analyses applied from the memo of recent bodies (same body, same server count; no worker time)",
            registry=r,
        ),
        analysis_dropped=Counter(
            "islwatch_analysis_dropped", "Analyses dropped because the analysis queue was full", registry=r
        ),
        analysis_skipped=Counter(
            "islwatch_analysis_skipped",
            "Requests relayed without analysis because --analysis-sample-rate left them out (never dropped)",
            ["model", "endpoint"],
            registry=r,
        ),
        analysis_worker_exits=Counter(
            "islwatch_analysis_worker_exits",
            "Analysis worker processes that exited unexpectedly (each is restarted)",
            registry=r,
        ),
        analysis_queue_depth=Gauge(
            "islwatch_analysis_queue_depth", "Analyses submitted and not yet finished", registry=r
        ),
        analysis_workers_live=Gauge(
            "islwatch_analysis_workers_live",
            "Analysis workers running with their tokenizers loaded (0: nothing is measured)",
            registry=r,
        ),
        fast_path_fallbacks=Counter(
            "islwatch_fast_path_fallbacks",
            "Tokenizer loads on which a fast-path shortcut was turned off (slower analysis, same counts), by "
            "reason (proxy/core/fast.py)",
            ["reason"],
            registry=r,
        ),
        analysis_errors=Counter(
            "islwatch_analysis_errors",
            "Analyses that raised (an islwatch bug, not the request's fault), by stage",
            ["stage"],
            registry=r,
        ),
    )


def _identity(r: CollectorRegistry) -> dict[str, Any]:
    """What the analysis counts with: the tokenizer identities, their changes, the parity checks, the build."""
    return dict(
        tokenizer_info=Gauge(
            "islwatch_tokenizer_info",
            "Loaded tokenizer identity (value 1)",
            # tokenizer_class and transformers_version: the same folder loads as another class under another
            # transformers release (the server's pin may differ from islwatch's); renderer: jinja, harmony
            # (gpt-oss on vLLM) or mistral (mistral-common), proxy/core/model.py.
            [
                "model",
                "tokenizer",
                "revision",
                "template_sha256",
                "tokenizer_sha256",
                "transformers_version",
                "tokenizer_class",
                "renderer",
            ],
            registry=r,
        ),
        tokenizer_changes=Counter(
            "islwatch_tokenizer_changes",
            "Reloads or analysis worker restarts that changed a model's tokenizer or template identity",
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
        dependency_info=Gauge(
            "islwatch_dependency_info",
            "aiohttp and transformers releases (value 1); tested=false: not the release islwatch is tested on "
            "or a private internal it uses moved (proxy/runtime/compat.py, logged at start-up)",
            ["library", "version", "tested"],
            registry=r,
        ),
    )


def _bill(r: CollectorRegistry) -> dict[str, Any]:
    """The rest of the bill: usage beyond the prompt, and the engine's own counters."""
    return dict(
        output_tokens=_per_request("islwatch_output_tokens", "Output tokens per request, from usage", r),
        cached_prompt_tokens=_per_request(
            "islwatch_cached_prompt_tokens", "Prompt tokens served from the prefix cache, from usage", r
        ),
        reasoning_tokens=_per_request("islwatch_reasoning_tokens", "Reasoning output tokens, from usage", r),
        usage_fields=Counter(
            "islwatch_usage_fields",
            "Analysed answers by whether their usage reported a field (tells zero from not reported)",
            ["model", "field", "present"],
            registry=r,
        ),
        engine_tokens=Counter(
            "islwatch_engine_tokens",
            "Tokens the engine's own /metrics counted since islwatch started (--upstream-metrics-url)",
            ["kind", "engine"],
            registry=r,
        ),
        engine_scrapes=Counter(
            "islwatch_engine_scrapes", "Scrapes of the engine's /metrics, by result", ["result"], registry=r
        ),
    )


def _per_request(name: str, doc: str, registry: CollectorRegistry) -> Histogram:
    return Histogram(name, doc, ["model", "endpoint"], buckets=ISL_BUCKETS, registry=registry)
