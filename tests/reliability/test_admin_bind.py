"""Where the proxy listens. `POST /reload` on the admin port has no authentication, so an address without a
host (`--admin :9100`) means loopback, as it does for `--listen`; every interface is bound only when asked
for (`0.0.0.0:9100`, `[::]:9100`). Checked on the sockets the real `islwatch proxy` process opens (its
LISTEN entries in /proc/net/tcp), and on the deploy files, which must name the host they need."""

from __future__ import annotations

import re
import socket
import struct
from pathlib import Path

import pytest
import yaml

from proxy.server.config import load_config
from tests.lanes import sweep
from tests.reliability.reliability_peers import Child, free_port, running, spawn, wait_answering

REPO = Path(__file__).resolve().parents[2]
LISTEN = "0A"


def listening_on(port: int) -> set[str]:
    """The IPv4 addresses with a socket listening on `port`."""
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == LISTEN and int(hex_port, 16) == port:
            out.add(socket.inet_ntoa(struct.pack("<I", int(address, 16))))
    return out


@pytest.mark.parametrize(
    ("value", "host"),
    [(":9100", "127.0.0.1"), ("0.0.0.0:9100", "0.0.0.0"), ("[::]:9100", "::"), ("10.1.2.3:9100", "10.1.2.3")],
)
def test_an_address_without_a_host_means_loopback(value: str, host: str) -> None:
    config = load_config({"upstream": "http://u:1", "admin": value, "listen": value}, env={})
    assert config.admin_address == (host, 9100)
    assert config.listen_address == (host, 9100)


def start(admin: str, log: Path) -> Child:
    """`islwatch proxy --admin ADMIN`, ready once /readyz answers on loopback (each address here has it)."""
    port, admin_port = free_port(), int(admin.rsplit(":", 1)[1])
    cmd = ["proxy", "--upstream", "http://127.0.0.1:9", "--tokenizer", "none", "--server-probe", "off",
           "--listen", f"127.0.0.1:{port}", "--admin", admin]  # fmt: skip
    child = spawn(cmd, log, port, admin_port)
    wait_answering(child, child.admin_url + "/readyz")
    return child


@pytest.mark.parametrize(
    ("admin", "bound"), sweep([(":{}", "127.0.0.1"), ("0.0.0.0:{}", "0.0.0.0")], unpack=True)
)
def test_the_admin_port_binds_loopback_unless_told_otherwise(admin: str, bound: str, tmp_path: Path) -> None:
    port = free_port()
    with running(start(admin.format(port), tmp_path / "proxy.log")):
        assert listening_on(port) == {bound}


def test_deploy_files_name_the_admin_host_they_need() -> None:
    """Prometheus and the kubelet reach the admin port from outside the container: the deploy configs say
    0.0.0.0 in so many words (a bare `:9100` would now be loopback-only)."""
    compose = yaml.safe_load((REPO / "deploy/compose/islwatch.yaml").read_text())
    configmap = yaml.safe_load((REPO / "deploy/k8s/configmap.yaml").read_text())
    k8s = yaml.safe_load(configmap["data"]["islwatch.yaml"])
    for where, cfg in (("compose", compose), ("k8s", k8s)):
        for key in ("admin", "listen"):
            assert re.fullmatch(r"0\.0\.0\.0:\d+", cfg[key]), (where, key, cfg[key])
    # The image's default stays loopback; its healthcheck looks there (inside the container).
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "ISLWATCH_HEALTHCHECK_URL=http://127.0.0.1:9100/healthz" in dockerfile
    assert not re.search(r"--admin[ =]:\d", dockerfile + (REPO / "deploy/compose/compose.yaml").read_text())
