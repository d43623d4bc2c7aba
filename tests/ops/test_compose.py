"""deploy/compose: the file parses and its services are wired together (no Docker engine runs here)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ops.deploylib import check_proxy_config
from tests.ops.opslib import COMPOSE_DIR, REPO

COMPOSE = COMPOSE_DIR / "compose.yaml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]


def host_path(volume: str) -> Path:
    return (COMPOSE_DIR / volume.split(":", 1)[0]).resolve()


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path, for bind mounts (named volumes left out)."""
    out = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            out[target] = host_path(volume)
    return out


def published(service: dict[str, Any]) -> set[int]:
    return {int(p.split(":")[-1].split()[0]) for p in service.get("ports", [])}


def test_services(services: dict[str, Any]) -> None:
    assert {"vllm", "emulator", "islwatch", "prometheus", "grafana"} <= set(services)
    # Exactly one upstream runs per profile, and both answer as "upstream".
    assert services["vllm"]["profiles"] == ["gpu"] and services["emulator"]["profiles"] == ["cpu"]
    for name in ("vllm", "emulator"):
        assert "upstream" in services[name]["networks"]["backend"]["aliases"]
    for name in ("islwatch", "prometheus", "grafana"):
        assert "profiles" not in services[name], f"{name} must run in every profile"


def test_bind_mounts_exist(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for target, source in mounts(service).items():
            assert source.exists(), f"{name}: {source} (mounted at {target}) does not exist"


def test_build_context_is_the_repo(services: dict[str, Any]) -> None:
    for name in ("islwatch", "emulator"):
        build = services[name]["build"]
        context = (COMPOSE_DIR / build["context"]).resolve()
        assert context == REPO and (context / build["dockerfile"]).is_file()


def test_islwatch_config_is_accepted(services: dict[str, Any], tmp_path: Path) -> None:
    islwatch = services["islwatch"]
    args = islwatch["command"]
    assert args[0] == "proxy"
    config_path = args[args.index("--config") + 1]
    host_file = mounts(islwatch)[config_path]
    # The environment as compose passes it with nothing set by the operator (the CPU path).
    env = {
        k: re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", v)
        for k, v in islwatch["environment"].items()
        if k.startswith("ISLWATCH_")
    }
    config = check_proxy_config(host_file.read_text(), tmp_path, env)
    assert config.upstream == "http://upstream:8000"
    assert config.default_tokenizer == "builtin:mistral-v0.1"  # offline: the CPU profile needs no hub
    assert config.listen_address[1] in published(islwatch)
    assert config.admin_address[1] in published(islwatch)
    assert config.admin_address[0] == "0.0.0.0"  # Prometheus scrapes from another container
    # The upstreams listen where islwatch sends traffic.
    assert "--port=8000" in services["vllm"]["command"]
    emulate = services["emulator"]["command"]
    assert emulate[0] == "emulate" and emulate[emulate.index("--listen") + 1] == "0.0.0.0:8000"


def test_gpu_profile_config_is_accepted(services: dict[str, Any], tmp_path: Path) -> None:
    """The documented GPU command line: the model vLLM serves gets its own tokenizer."""
    islwatch = services["islwatch"]
    host_file = mounts(islwatch)[islwatch["command"][-1]]
    env = {"ISLWATCH_MODEL_TOKENIZERS": "Qwen/Qwen2.5-1.5B-Instruct=Qwen/Qwen2.5-1.5B-Instruct"}
    config = check_proxy_config(host_file.read_text(), tmp_path, env)
    assert config.model_tokenizers == {"Qwen/Qwen2.5-1.5B-Instruct": "Qwen/Qwen2.5-1.5B-Instruct"}


def test_prometheus_scrapes_islwatch_with_the_alerts(services: dict[str, Any]) -> None:
    prometheus = services["prometheus"]
    etc = mounts(prometheus)["/etc/prometheus"]
    config = yaml.safe_load((etc / "prometheus.yml").read_text())
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    assert all((etc / rule_file).is_file() for rule_file in config["rule_files"])
    assert "alerts.yml" in config["rule_files"]
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "islwatch"]
    (target,) = job["static_configs"][0]["targets"]
    admin_port = int(target.rsplit(":", 1)[1])
    assert target.split(":")[0] == "islwatch" and admin_port in published(services["islwatch"])
    assert job.get("metrics_path", "/metrics") == "/metrics"


def test_grafana_is_provisioned(services: dict[str, Any]) -> None:
    grafana = services["grafana"]
    m = mounts(grafana)
    assert m["/etc/grafana/provisioning"] == REPO / "grafana" / "provisioning"
    providers = yaml.safe_load((REPO / "grafana/provisioning/dashboards/islwatch.yml").read_text())[
        "providers"
    ]
    dash_dir = providers[0]["options"]["path"]
    assert (m[dash_dir] / "islwatch.json").is_file()
    source = yaml.safe_load((REPO / "grafana/provisioning/datasources/islwatch.yml").read_text())[
        "datasources"
    ][0]
    # The data source URL is the Prometheus service on its published port.
    assert source["url"] == "http://prometheus:9090" and 9090 in published(services["prometheus"])
    prom_interval = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())["global"]
    assert source["jsonData"]["timeInterval"] == prom_interval["scrape_interval"]


@pytest.mark.parametrize("name", ["islwatch", "emulator"])
def test_commands_parse_with_the_real_cli(services: dict[str, Any], name: str) -> None:
    """The image's ENTRYPOINT is `islwatch`; the service command is its arguments."""
    from proxy.cli import build_parser

    args = build_parser().parse_args(services[name]["command"])
    assert args.command == services[name]["command"][0]


def test_only_islwatch_reaches_the_inference_server(services: dict[str, Any]) -> None:
    """The upstream publishes no port and shares its network with islwatch alone: no way around the proxy."""
    for name in ("vllm", "emulator"):
        assert not services[name].get("ports"), f"{name} must not publish a port"
        assert set(services[name]["networks"]) == {"backend"}, name
    on_backend = {n for n, s in services.items() if "backend" in (s.get("networks") or {"default": None})}
    assert on_backend == {"vllm", "emulator", "islwatch"}
    assert set(services["islwatch"]["networks"]) == {"default", "backend"}  # Prometheus scrapes it


def test_vllm_image_is_the_tested_version(services: dict[str, Any]) -> None:
    from proxy.core.specs import VLLM_IMAGE

    assert services["vllm"]["image"] == VLLM_IMAGE


def test_readyz_asks_the_upstream(services: dict[str, Any], tmp_path: Path) -> None:
    islwatch = services["islwatch"]
    config = check_proxy_config(mounts(islwatch)[islwatch["command"][-1]].read_text(), tmp_path, {})
    assert config.upstream_health_path == "/health"
