#!/usr/bin/env bash
# Installs (or reuses) NVIDIA AIPerf (PyPI `aiperf`) in a venv of its own, cached outside the clone and keyed
# by version, for bench/aiperf_vs_loadgen.py (the side-by-side with islwatch loadgen). Not needed by tests.
# Prints the venv's `aiperf` executable on the last line of stdout.
set -euo pipefail
VERSION="${AIPERF_VERSION:-0.13.0}"
VENV="${ISLWATCH_CACHE:-$HOME/.cache/islwatch}/aiperf-${VERSION%.0}"
BIN="$VENV/bin/aiperf"
if [ -f "$VENV/.installed" ] && "$BIN" --version >/dev/null 2>&1; then
  echo "aiperf: reusing $VENV (aiperf $VERSION)" >&2
  echo "$BIN"
  exit 0
fi
echo "aiperf: installing aiperf $VERSION into $VENV" >&2
rm -rf "$VENV"
# AIPerf 0.13 requires Python >= 3.10; it pins its own pydantic/zmq/textual, hence a venv of its own.
python3.11 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >&2
"$VENV/bin/python" -m pip install -q "aiperf==$VERSION" >&2
"$BIN" --version >&2
touch "$VENV/.installed"
echo "aiperf: installed $VENV" >&2
echo "$BIN"
