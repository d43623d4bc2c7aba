"""Session fixtures: vLLM 0.32's own request preprocessing for every family (tests/vllm_oracle/
oracle_proc.py), in a few long-lived subprocesses started at once, stopped by pid when this directory's last
test is done.

Skips (with the reason) only when vLLM cannot be installed here (a failure under CI: tests/conftest.py
`unavailable`), or the shared tokenizers are absent. An oracle that fails to start is a failure.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from oracle_proc import FAMILIES, Oracle, OracleProcess, launch, model_folder, stop
from vllm_server.vllm_proc import VllmUnavailable, find_python

from proxy.core.harmony_vocab import vocab_dir
from tests.conftest import SHARED_TOKENIZERS, unavailable
from tests.lifetimes import release_after_directory

HARMONY_FAMILY = "gpt-oss"
# How many oracle processes share the families (each pays vLLM's imports once; oracle_proc.py). 14 gives
# one process per family (~1.2 GB each).
PROCESSES = int(os.environ.get("ISLWATCH_VLLM_ORACLES", "2"))
_STARTED: dict[str, Oracle] = {}  # for the timing summary at the end of the run


@pytest.fixture(scope="session")
def oracle_python() -> str:
    try:
        return find_python()
    except VllmUnavailable as exc:
        unavailable(str(exc))


def harmony_vocab() -> dict[str, str]:
    """openai-harmony's vocabulary for gpt-oss, offline: the oracles' $TIKTOKEN_ENCODINGS_BASE is the folder
    islwatch derives it into (core/harmony_vocab.py)."""
    return {"TIKTOKEN_ENCODINGS_BASE": str(vocab_dir(SHARED_TOKENIZERS / HARMONY_FAMILY))}


@pytest.fixture(scope="session")
def oracles(oracle_python: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Oracle]]:
    shared = [f for f in FAMILIES if FAMILIES[f].mistral_file is None]
    missing = [f for f in shared if not (SHARED_TOKENIZERS / f).is_dir()]
    if missing:
        pytest.skip(f"shared tokenizers not present in {SHARED_TOKENIZERS}: {missing}")
    cache = Path(oracle_python).parents[1] / "oracle-models"  # next to the venv, like its tiny models
    env = harmony_vocab()
    logs = tmp_path_factory.mktemp("vllm-oracle")
    folders = {family: model_folder(cache, family, SHARED_TOKENIZERS) for family in FAMILIES}
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
        _STARTED.update(started)
        yield started
    finally:
        for process in processes:
            stop(process)


@pytest.fixture(scope="session", params=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def oracle(oracles: dict[str, Oracle], family: str) -> Oracle:
    return oracles[family]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How long the oracles took to start (all at once, on a shared machine) and to answer: a report, never
    an assertion."""
    if not _STARTED:
        return
    terminalreporter.section("vLLM oracle timings")
    processes = {id(o.process): o.process for o in _STARTED.values()}
    for process in processes.values():
        imports = process.seconds.get("imports", 0.0)
        terminalreporter.write_line(
            f"process {process.proc.pid}: ready in {process.ready_seconds:.1f} s ({len(process.folders)} "
            f"families; vLLM's imports {imports:.1f} s)"
        )
    for family, oracle in _STARTED.items():
        times = sorted(oracle.answer_seconds)
        median = f"{1000 * times[len(times) // 2]:.1f} ms" if times else "-"
        slowest = f"{1000 * times[-1]:.1f} ms" if times else "-"
        terminalreporter.write_line(
            f"{family:26} built in {oracle.build_seconds:5.1f} s; {len(times)} answers, median {median}, "
            f"slowest {slowest}"
        )
