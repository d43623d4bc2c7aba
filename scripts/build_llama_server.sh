#!/usr/bin/env bash
# Builds (or reuses) llama.cpp's llama-server from the source vendored in the
# llama-cpp-python sdist. The binary is cached outside the clone, keyed by version,
# because a cold build takes 9-14 minutes on 2 cores.
# Prints the binary's path on the last line of stdout.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${ISLWATCH_CACHE:-$HOME/.cache/islwatch}/llama-server-$VERSION"
BIN="$CACHE/llama-server"
if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
  echo "llama-server: reusing cached build $BIN (llama-cpp-python $VERSION)" >&2
  echo "$BIN"
  exit 0
fi
echo "llama-server: building from llama-cpp-python $VERSION sdist into $CACHE" >&2
command -v cmake >/dev/null && command -v ninja >/dev/null || {
  apt-get update -qq && apt-get install -y -qq cmake ninja-build g++ >/dev/null
}
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --no-binary=:all: -d "$work" "llama-cpp-python==$VERSION" >&2
tar -xzf "$work"/llama_cpp_python-"$VERSION".tar.gz -C "$work"
src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DGGML_NATIVE=OFF >&2
cmake --build "$work/build" --target llama-server -j "$(nproc)" >&2
mkdir -p "$CACHE"
cp "$work/build/bin/llama-server" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
echo "llama-server: built $BIN" >&2
echo "$BIN"
