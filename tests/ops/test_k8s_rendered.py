"""`kubectl kustomize deploy/k8s`, rendered as `kubectl apply -k` would send it, checked for what the tests
prove: the native sidecar, only islwatch's ports in the Service, vLLM bound to loopback, the tested vLLM
image, and the resource requests the documentation's sizing gives (docs/deployment.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from proxy.core.specs import TESTED_VERSIONS, VLLM_IMAGE
from tests.conftest import unavailable
from tests.ops.opslib import K8S, REPO

KUBECTL = shutil.which("kubectl")


@pytest.fixture(autouse=True, scope="module")  # before the module fixtures that render
def kubectl() -> None:
    """Every test here renders the kustomization with kubectl: a skip when it is missing, a failure under CI."""
    if KUBECTL is None:
        unavailable("kubectl is not installed (it renders the kustomization)")


@pytest.fixture(scope="module")
def objects() -> dict[str, dict[str, Any]]:
    assert KUBECTL is not None
    out = subprocess.run([KUBECTL, "kustomize", str(K8S)], capture_output=True, text=True, check=True)
    return {doc["kind"]: doc for doc in yaml.safe_load_all(out.stdout) if doc}


@pytest.fixture(scope="module")
def pod(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return objects["Deployment"]["spec"]["template"]["spec"]


def sidecar(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in pod["initContainers"] if c["name"] == "islwatch"]
    return container


def test_renders_the_expected_objects(objects: dict[str, dict[str, Any]]) -> None:
    assert set(objects) == {"ConfigMap", "Deployment", "Service", "PodMonitor"}


def test_islwatch_is_a_native_sidecar(pod: dict[str, Any]) -> None:
    assert sidecar(pod)["restartPolicy"] == "Always"
    assert sidecar(pod)["image"] == "islwatch:0.1.0"  # rewritten by the kustomization's images:


def test_service_exposes_only_islwatch(objects: dict[str, dict[str, Any]], pod: dict[str, Any]) -> None:
    islwatch_ports = {p["name"] for p in sidecar(pod)["ports"]}
    for svc_port in objects["Service"]["spec"]["ports"]:
        assert svc_port["targetPort"] in islwatch_ports
    for container in pod["containers"]:
        assert not container.get("ports"), f"{container['name']} exposes a port"


def test_vllm_is_bound_to_loopback_and_probed_through_islwatch(
    objects: dict[str, dict[str, Any]], pod: dict[str, Any]
) -> None:
    (vllm,) = pod["containers"]
    assert "--host=127.0.0.1" in vllm["args"]
    assert not any(a.startswith("--host=") and a != "--host=127.0.0.1" for a in vllm["args"])
    assert "readinessProbe" not in vllm  # the kubelet could not reach it
    config = yaml.safe_load(objects["ConfigMap"]["data"]["islwatch.yaml"])
    assert config["upstream_health_path"] == "/health"
    assert sidecar(pod)["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_images_are_the_tested_versions(pod: dict[str, Any]) -> None:
    (vllm,) = pod["containers"]
    assert vllm["image"] == VLLM_IMAGE
    assert VLLM_IMAGE.endswith("v" + TESTED_VERSIONS["vllm"])


def test_resource_requests_are_the_documented_sizing(pod: dict[str, Any]) -> None:
    page = (REPO / "docs" / "deployment.md").read_text()
    sizing = page.split("## Sizing", 1)[1].split("\n## ", 1)[0]
    m = re.search(r"requests (\d+Mi)\s.*?\swith\sa\s(\d+Mi)\slimit,\sand\s(\d+m)\sCPU", sizing, re.S)
    assert m, "docs/deployment.md's Sizing section states the requests"
    resources = sidecar(pod)["resources"]
    assert resources["requests"] == {"memory": m.group(1), "cpu": m.group(3)}
    assert resources["limits"]["memory"] == m.group(2)
