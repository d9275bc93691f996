#!/usr/bin/env bash
# Robustness of the upstrand FFI code: every upstrand scenario under valgrind memcheck (fails on any
# valgrind error), then a worker's RSS over REQUESTS failover walks (flat = no per-request leak).
# The Rust bench module/t/bench/upstrand_memcheck.rs (its doc says how).
#
#   module/t/bench/upstrand-memcheck.sh [PATH/TO/libngx_http_combined_upstreams_module.so]
#
# Environment: NGINX_BIN (default /usr/sbin/nginx), PER_SCENARIO (default 200), REQUESTS (default
# 100000), KEEP=1 keeps the valgrind log (path printed).
set -euo pipefail
cd "$(dirname "$0")/../../.."
. module/t/bench/cargo-bench.sh
run_bench upstrand_memcheck "${1:-$PWD/target/release/libngx_http_combined_upstreams_module.so}"
