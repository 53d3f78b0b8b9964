#!/usr/bin/env bash
# Operations checks (issue 34) that need outside programs: a real Prometheus scrapes a running
# server (and promtool checks the exposition). Installs Debian's prometheus package if missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    else
        echo "ci/ops.sh: prometheus and promtool are needed (Debian: apt-get install prometheus)" >&2
        exit 1
    fi
fi

cargo test -p ricochet --test ops_metrics -- --ignored --nocapture
