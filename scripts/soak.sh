#!/usr/bin/env bash
# Chaos soak: nginx with the module (2 workers, live mode), `tributary serve` with the
# `file` plugin and a registry rewritten every 100 ms, keep-alive, new-connection and long-lived
# client traffic, while the daemon, the plugin and nginx workers are SIGKILLed at random moments
# and nginx is reloaded now and then. Loopback only. What it asserts: docs/operations.md, "Chaos soak".
# Usage: scripts/soak.sh [--minutes N] [--seed S] [--keep]
#   --minutes N  how long the faults and the traffic run (default 3: the form scripts/test.sh runs)
#   --seed S     replay the faults and the registry of an earlier run (its first line prints the seed)
#   --keep       keep the work folder (daemon log, nginx error log) also when every check passed
# Prints the report table and `N passed, N failed`; exits non-zero when a check failed.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
  echo "soak.sh: nginx is not installed (scripts/setup.sh test installs it)" >&2
  exit 1
fi
# What it runs: the release module .so, the debug daemon and file plugin (test.sh builds all three
# before its script suites, so these are no-ops there), and the soak driver itself (a bench target
# with its own main, built in the test profile: crates/daemon/benches/soak/).
cargo build --release -p ngx-combined-upstreams
cargo build --workspace --bins
exec cargo test -q -p tributary --bench soak -- "$@"
