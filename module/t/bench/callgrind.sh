#!/usr/bin/env bash
# Instructions per request of the nginx worker under valgrind's callgrind for upstrand and live
# requests, as ratios to a plain `proxy_pass` in the same run: the Rust bench module/t/bench/callgrind.rs
# (its doc lists the endpoints and the environment: NGINX_BIN, REQUESTS, ROUNDS, ANNOTATE, KEEP, BASE_SO).
#
#   module/t/bench/callgrind.sh [PATH/TO/libngx_http_combined_upstreams_module.so]
#
# Default .so: target/release/libngx_http_combined_upstreams_module.so (cargo build --release -p
# ngx-combined-upstreams).
set -euo pipefail
cd "$(dirname "$0")/../../.."
. module/t/bench/cargo-bench.sh
# KEEP=FILE names a file here (the other benches read KEEP=1): absolute for the bench in module/t
if [ -n "${KEEP:-}" ] && [ "${KEEP#/}" = "$KEEP" ]; then KEEP="$PWD/$KEEP"; export KEEP; fi
run_bench callgrind "${1:-$PWD/target/release/libngx_http_combined_upstreams_module.so}"
