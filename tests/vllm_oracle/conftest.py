"""Session fixtures: vLLM's own request preprocessing for every family (tests/vllm_oracle/oracle_proc.py),
in a few long-lived subprocesses started at once, stopped by pid when this directory's last test is done, for
each vLLM release tested (RELEASES: 0.32, the CPU build the vllm flavor models, and 0.33, PyPI's CUDA build
installed lightly). The release is the one session-scoped parameter here, so pytest runs one release's tests
after the other's and starts each release's processes once, stopping one's before starting the next (family
and oracle are function-scoped for that: a second session-scoped parameter would interleave the releases and
restart the processes at every switch).

Skips (with the reason) only when vLLM cannot be installed here (a failure under CI: tests/conftest.py
`unavailable`), or the shared tokenizers are absent. An oracle that fails to start is a failure.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.core.renderers.harmony_vocab import vocab_dir
from proxy.core.specs import TESTED_VERSIONS
from tests.conftest import TEST_TOKENIZERS, shared_dirs, unavailable
from tests.lifetimes import release_after_directory
from tests.vllm_oracle.oracle_proc import FAMILIES, Oracle, OracleProcess, launch, model_folder, stop
from tests.vllm_server.vllm_proc import INSTALL_SCRIPT, REPO, VllmUnavailable, venv_python

HARMONY_FAMILY = "gpt-oss"
# How many oracle processes share the families (each pays vLLM's imports once; oracle_proc.py). 14 gives
# one process per family (~1.2 GB each).
PROCESSES = int(os.environ.get("ISLWATCH_VLLM_ORACLES", "2"))
_STARTED: list[Oracle] = []  # for the timing summary at the end of the run
# The releases every shape is put to, by their key in TESTED_VERSIONS: (install script, env var of its python).
RELEASES = {
    "vllm": (INSTALL_SCRIPT, "ISLWATCH_VLLM_PYTHON"),
    "vllm_render": (REPO / "scripts" / "install_vllm_render.sh", "ISLWATCH_VLLM_RENDER_PYTHON"),
}


# The newer release runs the families of today (and DeepSeek-V3, whose tokenizer class moved with transformers):
# the six older ones answered every shape alike on both releases (1,260 of 1,260, measured once; the
# divergences it has are test_vllm_releases.py's), and 0.32 still runs them all. Halves the newer release's run.
NEWER_RELEASE_FAMILIES = frozenset(
    {
        "qwen3",
        "llama-3.1",
        "gemma-3",
        "gpt-oss",
        "deepseek-r1",
        "deepseek-v3",
        "mistral-nemo",
        "mistral-large-2411",
    }
)


@pytest.fixture(scope="session", params=list(RELEASES), ids=[TESTED_VERSIONS[r] for r in RELEASES])
def release(request: pytest.FixtureRequest) -> str:
    """The release's key in TESTED_VERSIONS."""
    return str(request.param)


@pytest.fixture(scope="session")
def oracle_python(release: str) -> str:
    script, env_var = RELEASES[release]
    try:
        return venv_python(script, env_var, VllmUnavailable, f"vLLM {TESTED_VERSIONS[release]}")
    except VllmUnavailable as exc:
        unavailable(str(exc))


def harmony_vocab() -> dict[str, str]:
    """openai-harmony's vocabulary for gpt-oss, offline: the oracles' $TIKTOKEN_ENCODINGS_BASE is the folder
    islwatch derives it into (core/renderers/harmony_vocab.py)."""
    return {"TIKTOKEN_ENCODINGS_BASE": str(vocab_dir(TEST_TOKENIZERS / HARMONY_FAMILY))}


@pytest.fixture(scope="session")
def oracles(
    oracle_python: str, release: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Oracle]]:
    shared = [f for f in FAMILIES if FAMILIES[f].mistral_file is None]
    shared_dirs(shared)  # the built test tokenizers: a skip when absent, a failure under CI
    venv = Path(oracle_python).parents[1]
    cache = venv / "oracle-models"  # next to the venv, like its tiny models
    # Each release its own vLLM cache: vLLM keeps what it inspects of a model class in a file named by the
    # class, valid for one hash of its source (model_executor/models/registry.py inspect_model_cls). Two
    # releases sharing ~/.cache/vllm overwrite each other's files, and every start then inspects each
    # architecture again in a subprocess (20-70 s each on 2 busy cores).
    env = {**harmony_vocab(), "VLLM_CACHE_ROOT": str(venv / "vllm-cache")}
    logs = tmp_path_factory.mktemp("vllm-oracle")
    served = [f for f in FAMILIES if release == "vllm" or f in NEWER_RELEASE_FAMILIES]
    folders = {family: model_folder(cache, family, TEST_TOKENIZERS) for family in served}
    count = max(1, min(PROCESSES, len(folders)))
    shares = [dict(list(folders.items())[i::count]) for i in range(count)]  # round robin: costs even out
    processes: list[OracleProcess] = []
    try:
        for i, share in enumerate(shares):
            processes.append(launch(oracle_python, share, logs / f"oracle-{i}.log", env))
        for process in processes:
            process.wait_ready()
            release_after_directory(Path(__file__).parent, functools.partial(stop, process))
        started = {f: Oracle(f, d, p) for p in processes for f, d in p.folders.items()}
        _STARTED.extend(started.values())
        yield started
    finally:
        for process in processes:
            stop(process)


@pytest.fixture(params=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def oracle(oracles: dict[str, Oracle], family: str) -> Oracle:
    return oracles[family]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselects (never skips) the newer release's tests of the older families (NEWER_RELEASE_FAMILIES)."""
    kept, dropped = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        older = params.get("release") == "vllm_render" and params.get("family") not in (
            None,
            *NEWER_RELEASE_FAMILIES,
        )
        (dropped if older else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How long the oracles took to start (all at once, on a shared machine) and to answer: a report, never
    an assertion."""
    if not _STARTED:
        return
    terminalreporter.section("vLLM oracle timings")
    processes = {id(o.process): o.process for o in _STARTED}
    for process in processes.values():
        imports = process.seconds.get("imports", 0.0)
        terminalreporter.write_line(
            f"vLLM {process.version} process {process.proc.pid}: ready in {process.ready_seconds:.1f} s "
            f"({len(process.folders)} families; vLLM's imports {imports:.1f} s)"
        )
    for oracle in _STARTED:
        times = sorted(oracle.answer_seconds)
        median = f"{1000 * times[len(times) // 2]:.1f} ms" if times else "-"
        slowest = f"{1000 * times[-1]:.1f} ms" if times else "-"
        terminalreporter.write_line(
            f"{oracle.version} {oracle.family:26} built in {oracle.build_seconds:5.1f} s; {len(times)} answers, "
            f"median {median}, slowest {slowest}"
        )
