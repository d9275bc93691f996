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
cargo build --workspace --bins

echo "== clippy"
cargo clippy --workspace --all-targets -- -D warnings

echo "== tests"
cargo nextest run --workspace --no-fail-fast
