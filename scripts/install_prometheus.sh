#!/usr/bin/env bash
# Installs `prometheus` and `promtool` from Debian's `prometheus` package, for the ops tests and
# scripts/check_rules.sh.
#
# Why extract the .deb instead of `apt-get install prometheus`: the package's maintainer scripts create a
# system user and start a service, and it pulls a dozen JavaScript packages for the web UI. The two
# binaries are self-contained Go programs (they need only libc), so `apt-get download` + `dpkg -x` is enough.
#
# Idempotent: when both binaries already work in the install dir, it only reports them.
# Install dir: $ISLWATCH_PROMETHEUS_HOME (default /opt/islwatch/prometheus), outside the clone; the binaries
# are also linked into /usr/local/bin when that is writable and holds no other prometheus/promtool.
# Tests find the binaries through $ISLWATCH_PROMETHEUS / $ISLWATCH_PROMTOOL, then
# $ISLWATCH_PROMETHEUS_HOME/bin, then PATH (see tests/ops/opslib.py).
#
# Output: what it did goes to stderr; stdout carries only `export` lines for those two variables, so
#   eval "$(bash scripts/install_prometheus.sh)"
# sets them in the calling shell.
set -euo pipefail

HOME_DIR="${ISLWATCH_PROMETHEUS_HOME:-/opt/islwatch/prometheus}"
BIN_DIR="$HOME_DIR/bin"
LINK_DIR="${ISLWATCH_PROMETHEUS_LINK_DIR:-/usr/local/bin}"

say() { echo "install_prometheus: $*" >&2; }
exports() {
  printf 'export ISLWATCH_PROMETHEUS=%q\n' "$BIN_DIR/prometheus"
  printf 'export ISLWATCH_PROMTOOL=%q\n' "$BIN_DIR/promtool"
}

works() { [ -x "$BIN_DIR/prometheus" ] && [ -x "$BIN_DIR/promtool" ] &&
  "$BIN_DIR/prometheus" --version >/dev/null 2>&1 && "$BIN_DIR/promtool" --version >/dev/null 2>&1; }

link_binaries() {
  [ -d "$LINK_DIR" ] && [ -w "$LINK_DIR" ] || { say "not linking into $LINK_DIR (not writable)"; return 0; }
  for name in prometheus promtool; do
    target="$LINK_DIR/$name"
    if [ -L "$target" ] && [ "$(readlink "$target")" = "$BIN_DIR/$name" ]; then
      continue
    elif [ -e "$target" ]; then
      say "left $target alone (it is not ours)"
    else
      ln -s "$BIN_DIR/$name" "$target"
      say "linked $target -> $BIN_DIR/$name"
    fi
  done
}

if works; then
  say "already installed in $BIN_DIR: $("$BIN_DIR/prometheus" --version 2>&1 | head -n1)"
  link_binaries
  exports
  exit 0
fi

command -v apt-get >/dev/null || { say "apt-get not found: this script needs a Debian-based machine"; exit 1; }
command -v dpkg >/dev/null || { say "dpkg not found"; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# apt drops privileges to _apt for downloads; let it write here so it does not warn about sandboxing.
chmod 0755 "$work"
if id _apt >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then chown _apt "$work"; fi

download() { (cd "$work" && apt-get download -q prometheus >/dev/null); }
if ! download 2>/dev/null; then
  # A brand-new machine has empty package lists: refresh them once and retry.
  say "package lists lack prometheus; running apt-get update"
  apt-get update -q >/dev/null
  download
fi
deb="$(ls "$work"/prometheus_*.deb)"
say "downloaded $(basename "$deb")"

dpkg -x "$deb" "$work/root"
mkdir -p "$BIN_DIR"
for name in prometheus promtool; do
  install -m 0755 "$work/root/usr/bin/$name" "$BIN_DIR/$name"
done
works || { say "installed binaries do not run"; exit 1; }
say "installed into $BIN_DIR: $("$BIN_DIR/prometheus" --version 2>&1 | head -n1)"
link_binaries
exports
