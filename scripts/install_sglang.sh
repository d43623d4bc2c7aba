#!/usr/bin/env bash
# Installs (or reuses) SGLang in a venv of its own, cached outside the clone and keyed by version, for the
# SGLang tests (tests/sglang_server): they run SGLang's own chat preprocessing in-process, no engine.
# A cold install is ~7.0 GB and 3.5-6.5 minutes on 2 cores. Prints the venv's python on the last line of stdout.
# - sglang itself --no-deps, then its requirements from its own metadata less the GPU-only ones (kernels,
#   CUDA bindings, flash attention: none of them install or run on this CPU machine);
# - torch/torchvision pinned together: SGLang imports torchvision unconditionally, and PyPI's torchvision
#   0.29.1 needs torch 2.14.1 (which runs on the CPU); the vLLM venv's 2.13.0+cpu does not work with it;
# - dill and datasets, which its imports need but its metadata does not pull in without the GPU extras.
set -euo pipefail
VERSION="${SGLANG_VERSION:-0.5.23}"
VENV="${ISLWATCH_CACHE:-$HOME/.cache/islwatch}/sglang-$VERSION"
PY="$VENV/bin/python"
# The installed version, not `import sglang`: that import alone takes seconds.
installed() { "$PY" -c "from importlib.metadata import version; print(version('sglang'))" 2>/dev/null; }
if [ -f "$VENV/.installed" ] && [ "$(installed)" = "$VERSION" ]; then
  echo "sglang: reusing $VENV (sglang $VERSION)" >&2
  echo "$PY"
  exit 0
fi
echo "sglang: installing sglang $VERSION into $VENV" >&2
rm -rf "$VENV"
python3.11 -m venv "$VENV"
"$PY" -m pip install -q --upgrade pip >&2
"$PY" -m pip install -q "torch==2.14.1" "torchvision==0.29.1" >&2
"$PY" -m pip install -q --no-deps "sglang==$VERSION" >&2
# Its requirements (extras and foreign platforms left out by their markers), less the GPU-only packages.
# (torch and torchvision are pinned below; torchaudio and torchcodec are CUDA builds text serving never loads.)
GPU_ONLY='^(cuda-python|flash-attn-4|flashinfer[-_]python|humming-kernels|nvidia-.*|nvshmem4py-.*|quack-kernels'
GPU_ONLY+='|sgl-.*|sglang-kernel|tilelang|torch[-_]memory[-_]saver|torchaudio|torchcodec|torch|torchvision)$'
"$PY" "$(dirname "$0")/requirements_less.py" sglang "$GPU_ONLY" >"$VENV/requirements.txt"
# --no-warn-conflicts: pip would list every GPU-only requirement left out as missing.
"$PY" -m pip install -q --no-warn-conflicts -r "$VENV/requirements.txt" dill datasets \
  "torch==2.14.1" "torchvision==0.29.1" >&2
"$PY" -c "import sglang, torch, transformers; print('sglang', sglang.__version__, 'torch', torch.__version__,
'transformers', transformers.__version__)" >&2
touch "$VENV/.installed"
echo "sglang: installed $VENV" >&2
echo "$PY"
