#!/usr/bin/env bash
# CI steps beyond the README's test command, called by .ci/run when executable.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n=== extra: %s === (%ss)\n' "$*" "$SECONDS"; }

step "ricochet-ffi: C and C++ under ASan/UBSan (gcc -Wall -Wextra -Werror)"
# Also part of `cargo test --workspace`; run again here by name so a skipped or missing step
# shows. The C programs are built with -fsanitize=address,undefined against the library.
command -v gcc >/dev/null || { echo "gcc is required for the C ABI tests" >&2; exit 1; }
cargo test -q -p ricochet-ffi --test c_echo --test bad_use --test tokens --test header

step "ricochet-ffi: C# under Mono"
# Unity's scripting runtime is Mono; Debian packages it. Installed here when missing.
if ! command -v mcs >/dev/null || ! command -v mono >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mono-mcs mono-runtime >/dev/null
    else
        echo "mcs/mono missing and cannot install them (needs root and apt-get)" >&2
        exit 1
    fi
fi
RICOCHET_REQUIRE_MONO=1 cargo test -q -p ricochet-ffi --test csharp

step "operations: a real Prometheus scrape, promtool, ricochet-top in tmux"
bash ci/ops.sh
