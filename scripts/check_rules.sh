#!/usr/bin/env bash
# Checks the Prometheus alert rules: syntax (promtool check rules) and behaviour (promtool test rules,
# deploy/prometheus/alerts_test.yml). Also checks the local Prometheus config that loads them.
# promtool comes from scripts/install_prometheus.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

PROMTOOL="${PROMTOOL:-${ISLWATCH_PROMTOOL:-}}"
if [ -z "$PROMTOOL" ]; then
  for candidate in "${ISLWATCH_PROMETHEUS_HOME:-/opt/islwatch/prometheus}/bin/promtool" "$(command -v promtool || true)"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then PROMTOOL="$candidate"; break; fi
  done
fi
[ -n "$PROMTOOL" ] || { echo "check_rules: promtool not found; run scripts/install_prometheus.sh" >&2; exit 1; }

echo "check_rules: using $PROMTOOL ($("$PROMTOOL" --version 2>&1 | head -n1))"
"$PROMTOOL" check rules deploy/prometheus/alerts.yml
# `check config` resolves rule_files relative to the config file, so the alerts are checked again
# through the config that compose mounts.
"$PROMTOOL" check config deploy/prometheus/prometheus.yml
(cd deploy/prometheus && "$PROMTOOL" test rules alerts_test.yml)
