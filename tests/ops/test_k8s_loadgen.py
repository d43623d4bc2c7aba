"""`kubectl kustomize deploy/k8s/loadgen`: the Indexed Job's pods, their arguments expanded as the kubelet
expands them for each completion index and parsed by `islwatch loadgen`'s own parser, send the one workload
exactly once between them, at the Service of deploy/k8s; the merge Job's script, run here on shard folders
written by the loadgen's code, waits for the last shard and merges them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from loadgen.config import LoadgenConfig
from loadgen.launch import config_from_args
from loadgen.shards import shard_senders, shard_share
from proxy.cli import build_parser
from tests.conftest import unavailable
from tests.loadgen.test_shards import fake_shard
from tests.ops.opslib import K8S

KUBECTL = shutil.which("kubectl")


@pytest.fixture(autouse=True, scope="module")  # before the module fixtures that render
def kubectl() -> None:
    """Every test here renders the kustomization with kubectl: a skip when it is missing, a failure under CI."""
    if KUBECTL is None:
        unavailable("kubectl is not installed (it renders the kustomization)")


LOADGEN = K8S / "loadgen"


@pytest.fixture(scope="module")
def objects() -> dict[tuple[str, str], dict[str, Any]]:
    assert KUBECTL is not None
    out = subprocess.run([KUBECTL, "kustomize", str(LOADGEN)], capture_output=True, text=True, check=True)
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out.stdout) if d}


@pytest.fixture(scope="module")
def settings(objects: dict[tuple[str, str], dict[str, Any]]) -> dict[str, str]:
    return dict(objects[("ConfigMap", "islwatch-loadgen")]["data"])


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion of command and args: a defined name is replaced, $$ is a $."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)  # fmt: skip


def container(job: dict[str, Any]) -> dict[str, Any]:
    (c,) = job["spec"]["template"]["spec"]["containers"]
    return c


def shard_configs(job: dict[str, Any], settings: dict[str, str]) -> list[LoadgenConfig]:
    """Each pod's config: its args expanded with its env (the ConfigMap and its completion index)."""
    c = container(job)
    assert [e["configMapRef"]["name"] for e in c["envFrom"]] == ["islwatch-loadgen"]
    out = []
    for index in range(job["spec"]["completions"]):
        env = {**settings, "JOB_COMPLETION_INDEX": str(index)}
        argv = [expand(a, env) for a in c["args"]]
        assert not any("$(" in a for a in argv), argv  # every reference resolves
        out.append(config_from_args(build_parser(argv).parse_args(argv)))
    return out


def test_renders_the_expected_objects(objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    assert set(objects) == {
        ("ConfigMap", "islwatch-loadgen"),
        ("PersistentVolumeClaim", "islwatch-loadgen-results"),
        ("Job", "islwatch-loadgen"),
        ("Job", "islwatch-loadgen-merge"),
    }


def test_the_job_runs_every_shard_at_once(
    objects: dict[tuple[str, str], dict[str, Any]], settings: dict[str, str]
) -> None:
    spec = objects[("Job", "islwatch-loadgen")]["spec"]
    assert spec["completionMode"] == "Indexed"
    # The merge waits for every shard, and the rate is split over all: all of them run together.
    assert spec["parallelism"] == spec["completions"] == int(settings["SHARDS"]) > 1
    assert container(objects[("Job", "islwatch-loadgen")])["image"] == "islwatch:0.1.0"


def test_shards_cover_the_workload_exactly_once(
    objects: dict[tuple[str, str], dict[str, Any]], settings: dict[str, str]
) -> None:
    configs = shard_configs(objects[("Job", "islwatch-loadgen")], settings)
    n = len(configs)
    assert sorted(c.shard for c in configs) == sorted(f"{i}/{n}" for i in range(n))
    assert [c.shard_index for c in configs] == list(range(n)) and {c.shard_count for c in configs} == {n}
    # The same run but for the shard: one setup, one run id, one folder on the volume.
    setups = {c.model_dump_json(exclude={"shard"}) for c in configs}
    assert len(setups) == 1
    assert {c.run_id for c in configs} == {settings["RUN_ID"]}
    assert {c.run_dir for c in configs} == {Path("/results") / settings["RUN_ID"]}
    # Senders and requests: each once, all of them.
    senders = [s for c in configs for s in shard_senders(c.shard_index, n, c.workers)]
    assert sorted(senders) == list(range(configs[0].senders))
    count = configs[0].request_count
    assert count is not None
    assert sum(shard_share(count, c.shard_index, n, c.workers) for c in configs) == count


def test_shards_load_the_service_with_its_tokenizer(
    objects: dict[tuple[str, str], dict[str, Any]], settings: dict[str, str]
) -> None:
    cfg = shard_configs(objects[("Job", "islwatch-loadgen")], settings)[0]
    service = yaml.safe_load((K8S / "service.yaml").read_text())
    (port,) = service["spec"]["ports"]
    assert cfg.url == f"http://{service['metadata']['name']}:{port['port']}"
    proxy_config = yaml.safe_load(
        yaml.safe_load((K8S / "configmap.yaml").read_text())["data"]["islwatch.yaml"]
    )
    assert proxy_config["model_tokenizers"][cfg.model] == cfg.tokenizer


def test_shards_and_merge_share_the_results_volume(objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    claim = objects[("PersistentVolumeClaim", "islwatch-loadgen-results")]
    assert "ReadWriteMany" in claim["spec"]["accessModes"]  # shard pods on many nodes write it
    for name in ("islwatch-loadgen", "islwatch-loadgen-merge"):
        pod = objects[("Job", name)]["spec"]["template"]["spec"]
        (vol,) = [v for v in pod["volumes"] if v["name"] == "results"]
        assert vol["persistentVolumeClaim"]["claimName"] == "islwatch-loadgen-results"
        (mount,) = [m for m in container(objects[("Job", name)])["volumeMounts"] if m["name"] == "results"]
        assert mount["mountPath"] == "/results"


def test_merge_script_waits_for_the_last_shard_then_merges(
    objects: dict[tuple[str, str], dict[str, Any]], settings: dict[str, str], tmp_path: Path
) -> None:
    merge = container(objects[("Job", "islwatch-loadgen-merge")])
    (script,) = merge["args"]
    assert merge["command"] == ["/bin/sh", "-c"] and "$(" not in script  # nothing for the kubelet to expand
    n, run_id = int(settings["SHARDS"]), settings["RUN_ID"]
    run = tmp_path / run_id
    for i in range(n - 1):
        fake_shard(run, i, n)
    env = {**os.environ, **settings, "HOLD_SECONDS": "0"}
    proc = subprocess.Popen(["/bin/sh", "-c", script.replace("/results", str(tmp_path))], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith(f"waiting for {n} shards")
    # Merging before this shard is written would be refused (a missing shard): exit 0 says it waited.
    fake_shard(run, n - 1, n)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-2000:] + err[-2000:]
    report = orjson.loads((run / "report.json").read_bytes())
    assert report["requests"] == 2 * n and report["config"]["shards"] == n
    assert (run / "report.html").is_file() and (run / "report.csv").is_file()
