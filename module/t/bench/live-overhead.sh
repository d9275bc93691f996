#!/usr/bin/env bash
# Cost of the live upstream API on the request path (A: zone, no upstreams_api; B: with upstreams_api;
# C: B with a PUT every 100 ms), ratios B/A and C/A in one run: the Rust bench
# module/t/bench/live_overhead.rs (its doc says how).
#
#   module/t/bench/live-overhead.sh [PATH/TO/libngx_http_combined_upstreams_module.so]
#
# Environment: NGINX_BIN (default /usr/sbin/nginx), ROUNDS (default 5), DURATION (wrk seconds, default 5),
# CONNS (default 32).
set -euo pipefail
cd "$(dirname "$0")/../../.."
. module/t/bench/cargo-bench.sh
run_bench live_overhead "${1:-$PWD/target/release/libngx_http_combined_upstreams_module.so}"
