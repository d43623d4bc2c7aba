"""deploy/k8s: the kustomize base parses and is wired together (ports, probes, config, selectors)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.server.config import ProxyConfig
from tests.ops.deploylib import ADMIN_PATHS, admin_routes, check_proxy_config
from tests.ops.opslib import K8S


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((K8S / name).read_text())


@pytest.fixture(scope="module")
def kustomization() -> dict[str, Any]:
    return load("kustomization.yaml")


@pytest.fixture(scope="module")
def pod() -> dict[str, Any]:
    return load("deployment.yaml")["spec"]["template"]


@pytest.fixture(scope="module")
def sidecar(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in pod["spec"]["initContainers"] if c["name"] == "islwatch"]
    return container


@pytest.fixture
def config(tmp_path: Path) -> ProxyConfig:
    cm = load("configmap.yaml")
    return check_proxy_config(cm["data"]["islwatch.yaml"], tmp_path)


def arg(container: dict[str, Any], flag: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in container["args"] if a.startswith(flag + "=")]
    return value


def port(container: dict[str, Any], name: str) -> int:
    (p,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return int(p)


def test_kustomization_lists_existing_files(kustomization: dict[str, Any]) -> None:
    assert kustomization["kind"] == "Kustomization"
    for resource in kustomization["resources"]:
        assert (K8S / resource).is_file(), resource
    kinds = {load(r)["kind"] for r in kustomization["resources"]}
    # The optional NetworkPolicy is offered, commented out.
    assert "# - networkpolicy.yaml" in (K8S / "kustomization.yaml").read_text()
    assert load("networkpolicy.yaml")["kind"] == "NetworkPolicy"
    assert kinds == {"ConfigMap", "Deployment", "Service", "PodMonitor"}
    # The Deployment's image name is the one kustomize rewrites.
    assert [i["name"] for i in kustomization["images"]] == ["islwatch"]


def test_every_manifest_parses() -> None:
    for path in K8S.glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc and "kind" in doc, path


def test_islwatch_is_a_native_sidecar(pod: dict[str, Any], sidecar: dict[str, Any]) -> None:
    assert sidecar["restartPolicy"] == "Always"  # init container that keeps running: a native sidecar
    assert sidecar["image"] == "islwatch"
    assert sidecar["args"][0] == "proxy"
    (server,) = pod["spec"]["containers"]
    assert server["image"].startswith("vllm/vllm-openai:")


def test_configmap_is_accepted_by_islwatch_proxy(config: ProxyConfig) -> None:
    assert config.upstream == "http://127.0.0.1:8000"
    assert config.model_tokenizers  # the model vLLM serves has its own tokenizer


def test_config_file_is_mounted_where_the_args_point(pod: dict[str, Any], sidecar: dict[str, Any]) -> None:
    args = sidecar["args"]
    config_path = Path(args[args.index("--config") + 1])
    (mount,) = [m for m in sidecar["volumeMounts"] if m["mountPath"] == str(config_path.parent)]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == load("configmap.yaml")["metadata"]["name"]
    assert config_path.name in load("configmap.yaml")["data"]


def test_ports_match_the_config(config: ProxyConfig, sidecar: dict[str, Any], pod: dict[str, Any]) -> None:
    assert port(sidecar, "http") == config.listen_address[1]
    assert port(sidecar, "admin") == config.admin_address[1]
    # Probes and Prometheus come from outside the pod network namespace: admin must not be loopback-only.
    assert config.admin_address[0] in ("0.0.0.0", "::")
    # islwatch's upstream is the inference server's loopback port in the same pod.
    (server,) = pod["spec"]["containers"]
    assert config.upstream == f"http://127.0.0.1:{arg(server, '--port')}"
    assert arg(server, "--host") == "127.0.0.1"


def test_probes(sidecar: dict[str, Any]) -> None:
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert sidecar[probe]["httpGet"]["path"] in ADMIN_PATHS


def test_probe_paths_are_served_by_the_proxy(sidecar: dict[str, Any], config: ProxyConfig) -> None:
    """Every probe path is a GET route of the admin app built from this config (the live test GETs them)."""
    routes = admin_routes(config)
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert ("GET", sidecar[probe]["httpGet"]["path"]) in routes, probe
    monitor = load("podmonitor.yaml")
    assert ("GET", monitor["spec"]["podMetricsEndpoints"][0]["path"]) in routes


def test_resource_requests(pod: dict[str, Any]) -> None:
    for container in pod["spec"]["initContainers"] + pod["spec"]["containers"]:
        requests = container["resources"]["requests"]
        assert "cpu" in requests and "memory" in requests, container["name"]


def test_hf_home_is_a_volume(pod: dict[str, Any], sidecar: dict[str, Any]) -> None:
    (hf_home,) = [e["value"] for e in sidecar["env"] if e["name"] == "HF_HOME"]
    mounts = {m["mountPath"]: m["name"] for m in sidecar["volumeMounts"]}
    assert hf_home in mounts
    assert mounts[hf_home] in {v["name"] for v in pod["spec"]["volumes"]}


def test_service_targets_the_proxy_port(pod: dict[str, Any], sidecar: dict[str, Any]) -> None:
    service = load("service.yaml")
    (svc_port,) = service["spec"]["ports"]
    assert svc_port["targetPort"] == "http"  # islwatch, never vLLM directly
    assert "http" in {p["name"] for p in sidecar["ports"]}
    (server,) = pod["spec"]["containers"]
    assert "ports" not in server  # vLLM listens on loopback: nothing to expose
    labels = pod["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()


def test_selectors_match(pod: dict[str, Any]) -> None:
    deployment = load("deployment.yaml")
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_podmonitor_scrapes_the_admin_port(pod: dict[str, Any], sidecar: dict[str, Any]) -> None:
    monitor = load("podmonitor.yaml")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "admin" and endpoint["path"] == "/metrics"
    assert "admin" in {p["name"] for p in sidecar["ports"]}
    # IslwatchProxyDown matches job "<namespace>/islwatch", the PodMonitor's default job label.
    assert monitor["metadata"]["name"] == "islwatch"


def test_sidecar_args_parse_with_the_real_cli(sidecar: dict[str, Any]) -> None:
    from proxy.cli import build_parser

    args = build_parser().parse_args(sidecar["args"])
    assert args.command == "proxy" and args.config == "/etc/islwatch/islwatch.yaml"
