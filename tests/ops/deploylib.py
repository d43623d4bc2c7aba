"""Checks shared by the Kubernetes and compose tests: is an islwatch.yaml one that `islwatch proxy` accepts?"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opslib import REPO

from proxy.config import FIELDS, ProxyConfig, load_config

ADMIN_PATHS = ("/metrics", "/healthz", "/readyz")


def check_proxy_config(text: str, tmp_path: Path, env: dict[str, str] | None = None) -> ProxyConfig:
    """Every key is a ProxyConfig field, and the real loader (YAML file + environment) validates it."""
    import yaml

    raw: dict[str, Any] = yaml.safe_load(text)
    unknown = {k.replace("-", "_") for k in raw} - set(FIELDS)
    assert not unknown, f"keys `islwatch proxy` does not accept: {unknown}"
    path = tmp_path / "islwatch.yaml"
    path.write_text(text)
    return load_config(flags={}, config_file=str(path), env=env or {})


def admin_routes_in_source() -> set[str]:
    """The admin paths the proxy's source registers (string literals of add_get/route calls)."""
    found = set()
    for source in (REPO / "proxy").glob("*.py"):
        text = source.read_text()
        found |= {p for p in ADMIN_PATHS if f'"{p}"' in text or f"'{p}'" in text}
    return found
