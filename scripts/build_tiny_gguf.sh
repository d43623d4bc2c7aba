#!/usr/bin/env bash
# Builds (or reuses) a tiny random-weight GGUF around a real tokenizer folder, with llama.cpp's own
# convert_hf_to_gguf.py from the llama-cpp-python sdist that llama-server is built from
# (scripts/build_llama_server.sh): `bash scripts/build_tiny_gguf.sh TOKENIZER_DIR ARCH` (qwen2, qwen3, llama,
# gpt_oss).
# Cached outside the clone, keyed by the tokenizer folder's content, ARCH, the sdist version and
# build_tiny_gguf.py, so CI builds each once (~1 minute); the converter is cached beside it.
# The model is built in $ISLWATCH_GGUF_PYTHON, else the vLLM venv (scripts/install_vllm.sh: torch,
# transformers). Prints the GGUF's path on the last line of stdout.
set -euo pipefail
SRC="$(cd "$1" && pwd)"
ARCH="$2"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${ISLWATCH_CACHE:-$HOME/.cache/islwatch}"
HERE="$(cd "$(dirname "$0")" && pwd)"
key=$(
  {
    echo "$ARCH $VERSION"
    sha256sum < "$HERE/build_tiny_gguf.py"
    (cd "$SRC" && find . -maxdepth 1 -type f ! -name config.json -print0 | sort -z | xargs -0 sha256sum)
  } | sha256sum | cut -c1-16
)
OUT="$CACHE/tiny-gguf/$(basename "$SRC")-$ARCH-$key.gguf"
if [ -s "$OUT" ]; then
  echo "tiny gguf: reusing $OUT" >&2
  echo "$OUT"
  exit 0
fi
CONV="$CACHE/llama-cpp-convert-$VERSION"
if [ ! -f "$CONV/convert_hf_to_gguf.py" ]; then
  echo "tiny gguf: fetching convert_hf_to_gguf.py from llama-cpp-python $VERSION into $CONV" >&2
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  python3 -m pip download -q --no-deps --no-binary=:all: -d "$work" "llama-cpp-python==$VERSION" >&2
  src="llama_cpp_python-$VERSION/vendor/llama.cpp"
  tar -xzf "$work/llama_cpp_python-$VERSION.tar.gz" -C "$work" \
    "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py" "$src/LICENSE"
  rm -rf "$CONV.tmp" && mv "$work/$src" "$CONV.tmp" && rm -rf "$CONV" && mv "$CONV.tmp" "$CONV"
fi
PY="${ISLWATCH_GGUF_PYTHON:-$(bash "$HERE/install_vllm.sh" | tail -1)}"
echo "tiny gguf: building $OUT from $SRC ($ARCH)" >&2
"$PY" "$HERE/build_tiny_gguf.py" "$SRC" "$ARCH" "$CONV" "$OUT"
echo "tiny gguf: built $OUT" >&2
echo "$OUT"
