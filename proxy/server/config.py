"""Proxy configuration: one pydantic model fed by a YAML file, `ISLWATCH_*` environment variables and flags.

Precedence, lowest first: defaults, the YAML file (`--config` or `ISLWATCH_CONFIG`), the environment, flags.
YAML keys are the flag names with `_` for `-`; environment variables are `ISLWATCH_<KEY>` upper-cased.
Every error names the key and where its value came from, and `islwatch proxy` exits 2 on one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from yarl import URL

from proxy.core.server_settings import REASONING_PARSERS
from proxy.core.specs import DEFAULT_TOKENIZER, ServerFlavor

ENV_PREFIX = "ISLWATCH_"
# A value for `tokenizer` that means: no default tokenizer, analyse only the models of `model_tokenizers`.
NO_TOKENIZER = "none"


class ConfigError(Exception):
    """Invalid configuration; the message is meant for the operator, one problem per line."""


def _host_port(value: str, key: str) -> tuple[str, int]:
    """`HOST:PORT`; a missing host (`:9100`) means loopback: every interface must be asked for (`0.0.0.0`,
    `[::]`), since POST /reload on the admin port has no authentication."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{key} must be HOST:PORT (port 0-65535), got {value!r}")
    return (host.strip("[]") or "127.0.0.1"), int(port)


class ProxyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    upstream: str = Field(description="base URL of the one OpenAI-compatible server all traffic goes to")
    listen: str = "0.0.0.0:9000"
    admin: str = "127.0.0.1:9100"
    tokenizer: str = DEFAULT_TOKENIZER
    model_tokenizers: dict[str, str] = Field(default_factory=dict)
    chat_template: str | None = None
    trust_remote_code: bool = False
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    analysis_workers: int = Field(default=1, ge=1, le=64)
    analysis_queue: int = Field(default=256, ge=1)
    analysis_mode: Literal["process", "thread"] = "process"
    # The fraction of analysable requests that are analysed (inspect.Policy.sampled); the rest are relayed
    # only and counted in islwatch_analysis_skipped_total, so a sidecar can cap its analysis CPU.
    analysis_sample_rate: float = Field(default=1.0, gt=0, le=1)
    # Outcomes kept for repeated bodies (proxy/server/memo.py); 0 sends every job to a worker.
    analysis_memo: int = Field(default=1024, ge=0)
    # Worker processes run this much nicer than the event loop (os.nice): on a saturated CPU the relay wins
    # and analyses drop (counted) instead of traffic waiting; 0 runs them at the same priority.
    analysis_nice: int = Field(default=10, ge=0, le=19)
    inject_stream_usage: bool = False
    # Which server's request preparation to predict (proxy/core/flavors/): vLLM, SGLang or llama-server.
    server_flavor: ServerFlavor = "vllm"
    dump_mismatches: str | None = None
    dump_max: int = Field(default=100, ge=1)
    upstream_timeout_seconds: float = Field(default=600.0, gt=0)
    # The largest upstream response head relayed (upstream.py HeadLimits): a status line, field name or value
    # of up to this many bytes, and this many fields. Above nginx's large buffers (4 x 8 KiB for a whole
    # head) and what vLLM, SGLang and llama-server send (a handful of short fields); past it, a 502 counted
    # as islwatch_upstream_errors_total{kind="head_too_large"}.
    upstream_max_field_bytes: int = Field(default=64 * 1024, ge=1024)
    upstream_max_header_fields: int = Field(default=1024, ge=16)
    # The traffic port's clients (proxy/server/guard.py): a request head must be complete this long after
    # its first byte, a body may pause this long between bytes, an idle keep-alive connection (or one that
    # sends nothing) is closed after this long (nginx: client_header_timeout, client_body_timeout 60 s,
    # keepalive_timeout 75 s), and connections past the cap are closed when accepted.
    header_timeout_seconds: float = Field(default=30.0, gt=0)
    body_timeout_seconds: float = Field(default=60.0, gt=0)
    idle_timeout_seconds: float = Field(default=75.0, gt=0)
    max_connections: int = Field(default=1024, ge=1)
    # Request bodies held at once, by their declared length (a chunked one counts as max_body_bytes): past
    # it a new request waits for room, then gets a 503 with Retry-After (guard.BodyBudget). A body peaks at
    # ~3x its size in memory, so 256 MiB keeps a burst of maximum-size bodies within the deploy/ manifests'
    # 1536Mi limit beside the ~450 MB the process tree uses.
    max_inflight_body_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    # Admin requests in flight at once (exposition.AdminGate); beyond, a 503 with Retry-After.
    admin_max_requests: int = Field(default=64, ge=1)
    # When set, /metrics and POST /reload need `Authorization: Bearer <token>` (/healthz and /readyz stay
    # open for the kubelet's probes). Set it from the environment (ISLWATCH_ADMIN_TOKEN, e.g. a Secret) or
    # the YAML file: a flag would show it in the process list.
    admin_token: SecretStr | None = None
    # When set, /readyz is 200 only while GET upstream + this path answers 200 too (vLLM and llama-server:
    # /health), so a server bound to loopback inside the pod is probed through islwatch's admin port.
    upstream_health_path: str | None = None
    # Ask the server's /tokenize how it tokenizes fixed probe texts (proxy/server/server_probe.py): at start,
    # after every reload and every interval. `auto` probes where /tokenize answers; `off` never sends one.
    server_probe: Literal["auto", "off"] = "auto"
    server_probe_interval_seconds: float = Field(default=600.0, gt=0)
    # The engine's own Prometheus endpoint (vLLM, SGLang: the server's /metrics; llama-server with --metrics),
    # scraped every interval; its token counters' increase since start is exported (engine_metrics.py).
    upstream_metrics_url: str | None = None
    upstream_metrics_interval_seconds: float = Field(default=15.0, gt=0)
    # The server's --mm-processor-kwargs (a JSON object: min_pixels, max_pixels, size) and whether it runs with
    # --trust-request-mm-kwargs: both change how many tokens an image costs (proxy/core/images.py).
    mm_processor_kwargs: dict[str, Any] | None = None
    trust_request_mm_kwargs: bool = False
    # The server's --default-chat-template-kwargs (a JSON object), merged under every request's own
    # chat_template_kwargs (e.g. {"enable_thinking": false} on a Qwen3 server): proxy/core/server_settings.py.
    default_chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    # The date a vLLM server writes into gpt-oss (Harmony) system messages: its VLLM_SYSTEM_START_DATE, else
    # (unset) today's UTC date, the server's clock in a container without TZ.
    harmony_start_date: str | None = Field(default=None, pattern=r"^\d{4}-\d{2}-\d{2}$")
    # The server's --tokenizer-mode: auto serves a Mistral folder (consolidated weights and tekken.json or
    # tokenizer.model.v*) through mistral-common; mistral always, hf never (proxy/core/model.py).
    tokenizer_mode: Literal["auto", "hf", "mistral"] = "auto"
    # SGLang's --reasoning-parser (proxy/core/server_settings.py): auto takes the model's documented one.
    reasoning_parser: Literal["auto", "none", "qwen3", "deepseek-r1", "gpt-oss"] = "auto"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"

    @field_validator("upstream")
    @classmethod
    def _upstream_url(cls, value: str) -> str:
        url = URL(value)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"upstream must be an http(s) URL with a host, got {value!r}")
        if url.query_string or url.fragment:
            raise ValueError("upstream must not carry a query or fragment")
        return value.rstrip("/")

    @field_validator("upstream_metrics_url")
    @classmethod
    def _metrics_url(cls, value: str | None) -> str | None:
        if value is not None and URL(value).scheme not in ("http", "https"):
            raise ValueError(f"upstream_metrics_url must be an http(s) URL, got {value!r}")
        return value or None

    @field_validator("mm_processor_kwargs", "default_chat_template_kwargs", mode="before")
    @classmethod
    def _json_object(cls, value: Any, info: Any) -> Any:
        """A JSON string (the environment, a flag) as vLLM's flag takes it; "" unsets it."""
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else None
            except ValueError as exc:
                raise ValueError(f"{info.field_name} must be a JSON object: {exc}") from exc
        if value is None and info.field_name == "default_chat_template_kwargs":
            return {}
        return value

    @field_validator("upstream_health_path")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"upstream_health_path must start with '/', got {value!r}")
        return value or None

    @field_validator("listen", "admin")
    @classmethod
    def _address(cls, value: str, info: Any) -> str:
        _host_port(value, info.field_name)
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("model_tokenizers")
    @classmethod
    def _models(cls, value: dict[str, str]) -> dict[str, str]:
        for model, spec in value.items():
            if not model or not spec:
                raise ValueError("model_tokenizers entries need a model name and a tokenizer spec")
        return value

    @property
    def listen_address(self) -> tuple[str, int]:
        return _host_port(self.listen, "listen")

    @property
    def admin_address(self) -> tuple[str, int]:
        return _host_port(self.admin, "admin")

    @property
    def default_tokenizer(self) -> str | None:
        return None if self.tokenizer.lower() == NO_TOKENIZER else self.tokenizer


FIELDS = tuple(ProxyConfig.model_fields)
# Optional keys an empty environment variable leaves unset.
_EMPTY_IS_UNSET = (
    "dump_mismatches",
    "chat_template",
    "upstream_health_path",
    "upstream_metrics_url",
    "harmony_start_date",
    "admin_token",
)


def parse_model_tokenizers(items: list[str] | str) -> dict[str, str]:
    """`MODEL=SPEC[@REV]` items (flags), or one comma-separated string (the environment variable)."""
    if isinstance(items, str):
        items = [i for i in (s.strip() for s in items.split(",")) if i]
    out: dict[str, str] = {}
    for item in items:
        model, sep, spec = item.partition("=")
        if not sep or not model.strip() or not spec.strip():
            raise ConfigError(f"model_tokenizers: expected MODEL=TOKENIZER[@REVISION], got {item!r}")
        out[model.strip()] = spec.strip()
    return out


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of keys, got {type(data).__name__}")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in FIELDS:
        name = ENV_PREFIX + key.upper()
        if name in env:
            value: Any = env[name]
            if key == "model_tokenizers":
                value = parse_model_tokenizers(value)
            elif key in _EMPTY_IS_UNSET and value == "":
                value = None
            out[key] = value
    return out


def load_config(
    flags: Mapping[str, Any] | None = None,
    config_file: str | None = None,
    env: Mapping[str, str] | None = None,
) -> ProxyConfig:
    """Merge the three sources (flags given as `None` are unset) and validate. Raises ConfigError."""
    env = os.environ if env is None else env
    config_file = config_file or env.get(ENV_PREFIX + "CONFIG") or None
    sources: list[tuple[str, dict[str, Any]]] = []
    if config_file:
        sources.append((f"config file {config_file}", _read_yaml(config_file)))
    sources.append(("environment", _from_env(env)))
    sources.append(("flags", {k: v for k, v in (flags or {}).items() if v is not None}))
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for where, values in sources:
        for key, value in values.items():
            merged[key] = value
            origin[key] = where
    try:
        return ProxyConfig(**merged)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"]) or "config"
            top = str(err["loc"][0]) if err["loc"] else ""
            where = origin.get(top, "defaults")
            if err["type"] == "missing":
                lines.append(
                    f"{key}: required (flag --{key.replace('_', '-')}, env {ENV_PREFIX}{key.upper()})"
                )
            elif err["type"] == "extra_forbidden":
                lines.append(f"{key}: unknown key (from {where}); known keys: {', '.join(FIELDS)}")
            else:
                lines.append(f"{key}: {err['msg']} (from {where})")
        raise ConfigError("invalid proxy configuration:\n  " + "\n  ".join(lines)) from exc


assert get_args(ProxyConfig.model_fields["reasoning_parser"].annotation) == REASONING_PARSERS, "one list"
