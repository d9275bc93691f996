#!/usr/bin/env bash
# Upstrand request handling as ratios against plain `proxy_pass` in the same run (wrk req/s and
# requests per worker CPU-second): the Rust bench module/t/bench/upstrand.rs (its doc lists the
# endpoints, targets and the environment: NGINX_BIN, ROUNDS, DURATION, CONNS).
#
#   module/t/bench/upstrand.sh [PATH/TO/libngx_http_combined_upstreams_module.so]
#
# Default .so: target/release/libngx_http_combined_upstreams_module.so (cargo build --release -p
# ngx-combined-upstreams). Passing another .so compares builds with the same command.
set -euo pipefail
cd "$(dirname "$0")/../../.."
. module/t/bench/cargo-bench.sh
run_bench upstrand "${1:-$PWD/target/release/libngx_http_combined_upstreams_module.so}"
