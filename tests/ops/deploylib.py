"""Checks shared by the Kubernetes and compose tests: is an islwatch.yaml one that `islwatch proxy` accepts?"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.server.config import FIELDS, ProxyConfig, load_config

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


def admin_routes(config: ProxyConfig) -> set[tuple[str, str]]:
    """(method, path) of every route the proxy's admin app serves, from the real app (not started)."""
    from proxy.server.app import build_apps

    _, admin = build_apps(config)
    return {(route.method, route.resource.canonical) for route in admin.router.routes() if route.resource}
