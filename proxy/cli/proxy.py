"""`islwatch proxy`: parse flags, merge them with ISLWATCH_* variables and a YAML file, run until signalled.

SIGHUP reloads the tokenizers (as POST /reload does); SIGTERM and SIGINT stop the proxy gracefully.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING, Any

from proxy.cli.args import add_server_settings
from proxy.core.specs import FLAVORS

if TYPE_CHECKING:
    from proxy.server.config import ProxyConfig


def configure(parser: argparse.ArgumentParser) -> None:
    # Every default is None so that an unset flag does not override the YAML file or the environment;
    # the real defaults live in ProxyConfig (the README lists them).
    a = parser.add_argument
    a("--config", help="YAML file with any of the keys below (ISLWATCH_CONFIG)")
    a("--upstream", help="base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:8000 (required)")
    a("--listen", help="HOST:PORT for traffic (default 0.0.0.0:9000; no HOST: 127.0.0.1)")
    a("--admin", help="HOST:PORT for /metrics, /healthz, /readyz, POST /reload (default 127.0.0.1:9100; "
      "no HOST: 127.0.0.1, every interface only if asked: 0.0.0.0:9100)")  # fmt: skip
    a("--tokenizer", help="default tokenizer: PATH_OR_ID[@REVISION], builtin:NAME, or 'none' "
      "(default builtin:mistral-v0.1)")  # fmt: skip
    a("--model-tokenizer", action="append", metavar="MODEL=PATH_OR_ID[@REVISION]",
      help="tokenizer for one served model name (repeatable)")  # fmt: skip
    a(
        "--chat-template",
        metavar="FILE",
        help="chat template file overriding the tokenizer's (as the server's)",
    )
    a("--trust-remote-code", action="store_true", default=None, help="allow tokenizer code from the folder")
    a("--max-body-bytes", type=int, help="larger request bodies are relayed but not analysed (default 8 MiB)")
    a("--analysis-workers", type=int, help="analysis workers (default 1)")
    a("--analysis-queue", type=int, help="analyses in flight before new ones are dropped (default 256)")
    a("--analysis-mode", choices=["process", "thread"], help="workers are processes (default) or threads")
    a("--analysis-sample-rate", type=float,
      help="fraction of requests analysed, 0 < R <= 1; the rest are counted as skipped (default 1.0)")  # fmt: skip
    a("--analysis-nice", type=int, metavar="N",
      help="worker processes run N nicer than the event loop, 0-19 (default 10; 0: same priority)")  # fmt: skip
    a("--analysis-memo", type=int, metavar="N",
      help="outcomes kept for repeated request bodies, reused when the server count repeats (default 1024; 0: off)")  # fmt: skip
    a("--inject-stream-usage", action="store_true", default=None,
      help="ask streaming requests' upstream for usage, uncompressed (Accept-Encoding: identity), and hide it "
           "from the client (not for a client that refuses identity, nor a body that sets stream_options)")  # fmt: skip
    a(
        "--dump-mismatches",
        metavar="DIR",
        help="write mismatching requests (with prompts!) to DIR (0600 files)",
    )
    a("--dump-max", type=int, help="keep at most N dump files, oldest deleted first (default 100)")
    a("--upstream-timeout-seconds", type=float, help="max wait for the upstream's next bytes (default 600)")
    a("--upstream-max-field-bytes", type=int,
      help="longest upstream response status line, field name or value relayed (default 65536)")  # fmt: skip
    a("--upstream-max-header-fields", type=int,
      help="most fields in an upstream response head relayed (default 1024)")  # fmt: skip
    a("--header-timeout-seconds", type=float,
      help="a request head must be complete this long after its first byte (default 30)")  # fmt: skip
    a("--body-timeout-seconds", type=float, help="longest pause between request body bytes (default 60)")
    a("--idle-timeout-seconds", type=float, help="close a keep-alive connection idle this long (default 75)")
    a("--max-connections", type=int, help="client connections past this are closed at once (default 1024)")
    a("--max-inflight-body-bytes", type=int,
      help="request bodies held at once; past it new requests wait, then get a 503 (default 256 MiB)")  # fmt: skip
    a("--admin-max-requests", type=int, help="admin requests in flight; past it a 503 (default 64)")
    a("--server-probe", choices=["auto", "off"],
      help="compare the server's /tokenize with islwatch's ids on probe texts (default auto)")  # fmt: skip
    a("--server-probe-interval-seconds", type=float, help="seconds between server probes (default 600)")
    a("--upstream-health-path", metavar="PATH",
      help="/readyz also requires GET upstream+PATH to answer 200 (e.g. /health; default: not checked)")  # fmt: skip
    a("--upstream-metrics-url", metavar="URL",
      help="the engine's Prometheus /metrics; its token counters are exported beside usage (default off)")  # fmt: skip
    a("--upstream-metrics-interval-seconds", type=float, help="seconds between engine scrapes (default 15)")
    a("--server-flavor", choices=list(FLAVORS),
      help="whose request preparation to predict: vllm (default; also SGLang, TGI) or llama.cpp")  # fmt: skip
    add_server_settings(a)


def config_from_args(args: argparse.Namespace) -> ProxyConfig:
    from proxy.server.config import load_config, parse_model_tokenizers

    flags: dict[str, Any] = {
        key: getattr(args, key, None)
        for key in (
            "upstream", "listen", "admin", "tokenizer", "chat_template", "trust_remote_code", "max_body_bytes",
            "analysis_workers", "analysis_queue", "analysis_mode", "analysis_sample_rate", "analysis_memo", "analysis_nice", "inject_stream_usage", "dump_mismatches",
            "dump_max", "upstream_timeout_seconds", "server_flavor", "upstream_health_path", "server_probe",
            "server_probe_interval_seconds", "upstream_metrics_url", "upstream_metrics_interval_seconds",
            "header_timeout_seconds", "body_timeout_seconds", "idle_timeout_seconds", "max_connections",
            "default_chat_template_kwargs", "harmony_start_date", "tokenizer_mode", "reasoning_parser",
            "upstream_max_field_bytes", "upstream_max_header_fields", "max_inflight_body_bytes",
            "admin_max_requests",
        )
    }  # fmt: skip
    if getattr(args, "model_tokenizer", None):
        flags["model_tokenizers"] = parse_model_tokenizers(args.model_tokenizer)
    # `--log-level` belongs to the top-level `islwatch` parser; None when not given.
    level = getattr(args, "log_level", None)
    if level:
        flags["log_level"] = level
    return load_config(flags, getattr(args, "config", None))


def run(args: argparse.Namespace) -> int:
    from proxy.runtime.loop import run as run_loop
    from proxy.server.app import serve
    from proxy.server.config import ConfigError

    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"islwatch proxy: {exc}", file=sys.stderr)
        return 2
    logging.getLogger().setLevel(config.log_level)
    try:
        run_loop(serve(config))
    except OSError as exc:  # e.g. the port is taken
        print(f"islwatch proxy: {exc}", file=sys.stderr)
        return 1
    return 0
