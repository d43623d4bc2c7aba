"""Every private internal of aiohttp and transformers that islwatch uses, in one place, and the start-up check
that they are those of a tested release.

Private names change without notice between minor releases. islwatch is tested on the minor versions in
TESTED (pyproject.toml pins the same ones). On another release it still starts, says so in one log line per
library (`log_check`) and in `islwatch_dependency_info{library,version,tested}`, and each use below falls
back where it can (a missing template compiler only costs speed: fast.py renders with apply_chat_template).

What islwatch relies on, and where:
- aiohttp `http_writer._serialize_headers`, the module global `StreamWriter.write_headers` calls for each head:
  proxy/server/headers.py replaces it so a head keeps the bytes it was received with.
- aiohttp `StreamResponse._prepare_headers` and `_send_headers_immediately`, overridden by
  proxy/server/relay.py's RelayedResponse (no `Server` or default `Content-Type` added; the head held until
  the first body bytes).
- aiohttp `ClientSession._prepare_headers`'s set of names seen (proxy/server/headers.py FieldName).
- aiohttp `TCPConnector.connect(req, traces, timeout)`, overridden by proxy/runtime/pooled.py.
- aiohttp `web.RequestHandler`'s protocol methods, forwarded by proxy/server/guard.py.
- transformers `chat_template_utils._compile_jinja_template` (proxy/core/fast.py's render shortcut).
- transformers `PreTrainedTokenizerFast._tokenizer`, the Rust backend a copy is given in
  proxy/core/flavors/llama_cpp.py (`backend_tokenizer` is read-only).

Importing this module imports neither library: the counting core uses it too.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

# library -> the minor release islwatch is tested on (pyproject.toml pins `>=X.Y,<X.Y+1`).
TESTED = {"aiohttp": "3.14", "transformers": "5.24"}

_aiohttp_serialize_headers: Callable[..., bytes] | None = None


# ---- aiohttp -------------------------------------------------------------------------------------------------


def aiohttp_serialize_headers() -> Callable[..., bytes]:
    """aiohttp's own head serializer (`http_writer._serialize_headers`), as aiohttp set it."""
    global _aiohttp_serialize_headers
    if _aiohttp_serialize_headers is None:
        from aiohttp import http_writer

        _aiohttp_serialize_headers = http_writer._serialize_headers
    return _aiohttp_serialize_headers


def replace_serialize_headers(serialize: Callable[..., bytes]) -> None:
    """Make `serialize` write every head this process writes, requests and responses (idempotent)."""
    from aiohttp import http_writer

    aiohttp_serialize_headers()  # aiohttp's own, kept before it is replaced
    http_writer._serialize_headers = serialize


# ---- transformers --------------------------------------------------------------------------------------------


def compile_jinja_template(template: str) -> Any | None:
    """transformers' own compiled chat template (what apply_chat_template renders with); None if absent."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:
        return None
    return _compile_jinja_template(template)


def backend_of(tok: Any) -> Any | None:
    """A fast tokenizer's Rust backend (`_tokenizer`); None for another tokenizer."""
    return getattr(tok, "_tokenizer", None)


def set_backend(tok: Any, backend: Any) -> None:
    """Give a (copied) fast tokenizer another Rust backend (`backend_tokenizer` has no setter)."""
    tok._tokenizer = backend


# ---- the start-up check --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dependency:
    library: str
    version: str  # "" when not installed
    tested: bool  # the tested minor release, and every internal below is where islwatch expects it
    problems: tuple[str, ...]


def _version(library: str) -> str:
    try:
        return metadata.version(library)
    except metadata.PackageNotFoundError:
        return ""


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _aiohttp_problems() -> list[str]:
    from aiohttp import ClientSession, TCPConnector, http_writer, web

    out = []
    if not callable(getattr(http_writer, "_serialize_headers", None)):
        out.append("http_writer._serialize_headers is gone: heads with non-UTF-8 bytes lose them")
    if not inspect.iscoroutinefunction(getattr(web.StreamResponse, "_prepare_headers", None)):
        out.append("StreamResponse._prepare_headers changed: relayed heads may gain Server/Content-Type")
    if not hasattr(web.StreamResponse, "_send_headers_immediately"):
        out.append("StreamResponse._send_headers_immediately is gone: a head may go out before its body")
    if not callable(getattr(ClientSession, "_prepare_headers", None)):
        out.append("ClientSession._prepare_headers is gone: field names differing in case may merge")
    if list(inspect.signature(TCPConnector.connect).parameters) != ["self", "req", "traces", "timeout"]:
        out.append("TCPConnector.connect's signature changed: pooled retries may break")
    forwarded = ("connection_made", "data_received", "eof_received", "pause_writing", "resume_writing")
    if not all(callable(getattr(web.RequestHandler, m, None)) for m in (*forwarded, "connection_lost")):
        out.append("RequestHandler's protocol methods changed: the connection guard may break")
    return out


def _transformers_problems() -> list[str]:
    if "transformers" not in sys.modules:
        return []  # not loaded in this process (the proxy's analysis runs in workers): only its version
    try:
        from transformers.utils import chat_template_utils
    except ImportError:
        return ["transformers.utils.chat_template_utils is gone: the render shortcut is off"]
    if not callable(getattr(chat_template_utils, "_compile_jinja_template", None)):
        return ["_compile_jinja_template is gone: the render shortcut is off (slower, counts unchanged)"]
    return []


_PROBLEMS: dict[str, Callable[[], list[str]]] = {
    "aiohttp": _aiohttp_problems,
    "transformers": _transformers_problems,
}


def check(log: logging.Logger | None = None) -> list[Dependency]:
    """Each library: its version, whether it is the tested release, and what of its internals moved (said
    on `log`, see log_check). Never raises: a check that fails is itself a problem reported."""
    out = []
    for library, tested in TESTED.items():
        version = _version(library)
        try:
            problems = _PROBLEMS[library]() if version else [f"{library} is not installed"]
        except Exception as exc:  # the check must never stop the proxy: it says what it saw instead
            problems = [f"the check raised {type(exc).__name__}"]
        out.append(Dependency(library, version, _minor(version) == tested and not problems, tuple(problems)))
    if log is not None:
        log_check(log, out)
    return out


def log_check(log: logging.Logger, deps: list[Dependency]) -> None:
    """One line per library that is not a tested release (WARNING), or one line saying all are (INFO)."""
    untested = [d for d in deps if not d.tested]
    if not untested:
        log.info("tested releases: %s", ", ".join(f"{d.library} {d.version}" for d in deps))
    for d in untested:
        log.warning(
            "%s %s is not the release islwatch is tested on (%s.x): %s",
            d.library,
            d.version or "(none)",
            TESTED[d.library],
            "; ".join(d.problems) or "its private internals look unchanged",
        )
