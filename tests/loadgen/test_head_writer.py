"""The load generator keeps aiohttp's own C head serializer. The proxy replaces it process-wide so field
lines keep their received bytes (proxy/server/headers.py); the load generator writes only heads it built
itself, and at 4,000 req/s on one core every microsecond per request shows in its send lateness. It shares
the pooled-connection retry with the proxy (proxy/server/pooled.py), not the proxy's upstream module."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
from aiohttp import http_writer
print(http_writer._serialize_headers.__module__)
"""


def serializer_after_importing(*modules: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *modules], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_loadgen_process_keeps_aiohttps_head_serializer() -> None:
    # Everything `islwatch loadgen` imports on its way to sending (proxy.cli -> loadgen.cli -> ... -> runner).
    loadgen = (
        "proxy.cli",
        "loadgen.cli",
        "loadgen.launch",
        "loadgen.send.orchestrate",
        "loadgen.send.runner",
    )
    assert serializer_after_importing(*loadgen) == "aiohttp._http_writer"
    # ...while the proxy's upstream module does replace it: the probe tells the two apart.
    assert serializer_after_importing("proxy.server.upstream") == "proxy.server.headers"
