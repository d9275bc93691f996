#!/usr/bin/env bash
# The README's test command: sets up a fresh Debian machine (scripts/setup.sh test) and runs every test of
# the project: format, builds, clippy, the script suites, then the cargo tests (nextest) last.
# Usage: scripts/test.sh
# Exits non-zero when anything failed; after nextest's summary one line names what failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

scripts/setup.sh test || exit 1

failed=()

echo "== format"
cargo fmt --all -- --check || failed+=("cargo fmt")

echo "== build (module .so in release, daemon and plugins)"
cargo build --release -p ngx-combined-upstreams || exit 1
# the file name nginx users expect (cargo adds a `lib` prefix; the module tests load the prefixed file)
cp -f target/release/libngx_http_combined_upstreams_module.so target/release/ngx_http_combined_upstreams_module.so
cargo build --workspace --bins || exit 1

echo "== clippy"
cargo clippy --workspace --all-targets -- -D warnings || failed+=("cargo clippy")

echo "== module layers (no import cycle; unsafe {} and extern \"C\" only in the module's FFI layer)"
layers=$(python3 scripts/module-layers.py) || { echo "$layers"; failed+=("module layers"); }

# Script suites: each prints `N passed, N failed` and exits non-zero on a failure; all of them run.
SCRIPT_SUITES=(
  scripts/test-fresh-machine.sh  # the set-up of both README commands in a fresh Debian chroot
  scripts/test-nginx-versions.sh # the module against Debian's nginx of bookworm, trixie and sid
  scripts/test-packages.sh       # the Debian packages installed, used and purged in fresh chroots
  scripts/soak.sh                # the chaos soak, its 3-minute form (faults at random moments)
)
for suite in "${SCRIPT_SUITES[@]}"; do
  echo "== $suite"
  bash "$suite" || failed+=("$suite")
done

echo "== tests"
cargo nextest run --workspace --no-fail-fast || failed+=("cargo nextest")

if [ ${#failed[@]} -gt 0 ]; then
  echo "test.sh: failed: ${failed[*]}"
  exit 1
fi
