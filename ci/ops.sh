#!/usr/bin/env bash
# Operations checks (issue 34) that need outside programs: a real Prometheus scrapes a running
# server (promtool checks the exposition), and ricochet-top runs in a real terminal (tmux).
# Installs Debian's prometheus and tmux packages if they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "ci/ops.sh: needs ${missing[*]} (Debian: apt-get install ${missing[*]})" >&2
        exit 1
    fi
fi

# A real Prometheus scrapes a server; promtool checks the exposition.
cargo test -p ricochet --test ops_metrics -- --ignored --nocapture
# ricochet-top driven in a real terminal.
cargo test -p ricochet-top --test tmux -- --ignored --nocapture
