#!/usr/bin/env bash
# CI checks beyond `cargo test`, each in a script of its own (`.ci/run` calls this).
set -euo pipefail
cd "$(dirname "$0")/.."

bash ci/ops.sh
