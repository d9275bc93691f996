#!/usr/bin/env bash
# Sets up a fresh Debian bookworm machine and runs every test of the project.
# Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

echo "== format"
cargo fmt --all -- --check

echo "== build (module .so in release, daemon and plugins)"
cargo build --release -p ngx-combined-upstreams
# the file name nginx users expect (cargo adds a `lib` prefix; the module tests load the prefixed file)
cp -f target/release/libngx_http_combined_upstreams_module.so target/release/ngx_http_combined_upstreams_module.so
cargo build --workspace --bins

echo "== clippy"
cargo clippy --workspace --all-targets -- -D warnings

echo "== script suites (nginx versions, Debian packages)"
suites_rc=0; scripts/test-nginx-versions.sh || suites_rc=1; scripts/test-packages.sh || suites_rc=1

echo "== tests"
cargo nextest run --workspace --no-fail-fast
exit "$suites_rc"
