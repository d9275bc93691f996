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
SO="$(readlink -f "${1:-$PWD/target/release/libngx_http_combined_upstreams_module.so}")"
# cargo runs the bench in module/t: paths become absolute here
[ -n "${BASE_SO:-}" ] && BASE_SO="$(readlink -f "$BASE_SO")" && export BASE_SO
[ -n "${KEEP:-}" ] && KEEP="$(readlink -f "$KEEP")" && export KEEP
COMBINED_UPSTREAMS_MODULE="$SO" exec cargo bench -q -p combined-upstreams-tests --bench callgrind
