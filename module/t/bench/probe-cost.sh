#!/usr/bin/env bash
# Cost of active health checks (`probe`): 1,000 servers probed every second (B) against none (A), idle
# worker CPU and proxied p99 / req per worker CPU-second, ratios B/A in one run: the Rust bench
# module/t/bench/probe_cost.rs (its doc says how).
#
#   module/t/bench/probe-cost.sh [PATH/TO/libngx_http_combined_upstreams_module.so]
#
# Environment: NGINX_BIN (default /usr/sbin/nginx), ROUNDS (default 3), IDLE (default 10),
# DURATION (default 10), CONNS (default 16).
set -euo pipefail
cd "$(dirname "$0")/../../.."
. module/t/bench/cargo-bench.sh
run_bench probe_cost "${1:-$PWD/target/release/libngx_http_combined_upstreams_module.so}"
