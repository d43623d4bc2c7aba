#!/usr/bin/env bash
# The test command: installs what the tests need on a fresh machine, then runs the whole suite.
# - Python deps (the package with its test extra)
# - llama.cpp's llama-server, built once from the llama-cpp-python sdist and cached (interop tests)
# - vLLM's CPU build in a venv of its own, installed once and cached (tests/vllm_server)
# - Prometheus and promtool from Debian's package (alert-rule tests, live PromQL test)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e '.[test]' 2>&1 | grep -v -e '^WARNING' -e 'pip as the .root. user' || true
if [ -z "${ISLWATCH_LLAMA_SERVER:-}" ]; then
  if out=$(bash scripts/build_llama_server.sh); then
    export ISLWATCH_LLAMA_SERVER="${out##*$'\n'}"
  else
    echo "test.sh: llama-server could not be built; interop tests will skip" >&2
  fi
fi
if [ -z "${ISLWATCH_VLLM_PYTHON:-}" ]; then
  if out=$(bash scripts/install_vllm.sh); then
    export ISLWATCH_VLLM_PYTHON="${out##*$'\n'}"
  else
    echo "test.sh: vLLM could not be installed; vLLM tests will skip" >&2
  fi
fi
if [ -f scripts/install_prometheus.sh ]; then
  eval "$(bash scripts/install_prometheus.sh)"  # exports ISLWATCH_PROMETHEUS / ISLWATCH_PROMTOOL
fi
if [ -f scripts/check_rules.sh ]; then
  bash scripts/check_rules.sh
fi
exec python3 -m pytest -q -p no:cacheprovider "$@"
