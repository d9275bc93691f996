#!/usr/bin/env bash
# Active health checks (`probe`) under valgrind memcheck (master + 2 workers, every process under
# memcheck): servers that answer 200, 503, never, or refuse, PUTs replacing the set every 300 ms,
# traffic, one reload; fails unless every report says "ERROR SUMMARY: 0 errors" and the zone's slab
# figures did not grow. The Rust bench module/t/bench/probe_memcheck.rs (its doc says how).
#
#   module/t/bench/probe-memcheck.sh [PATH/TO/libngx_http_combined_upstreams_module.so]
#
# Environment: NGINX_BIN (default /usr/sbin/nginx), SECONDS_OF_LOAD (default 40), KEEP=1 keeps
# the valgrind logs (directory printed), VALGRIND_EXTRA (more valgrind options).
set -euo pipefail
cd "$(dirname "$0")/../../.."
. module/t/bench/cargo-bench.sh
run_bench probe_memcheck "${1:-$PWD/target/release/libngx_http_combined_upstreams_module.so}"
