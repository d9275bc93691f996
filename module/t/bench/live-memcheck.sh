#!/usr/bin/env bash
# The live upstream API under valgrind memcheck (master + 2 workers, every process under memcheck):
# traffic while PUTs replace the server sets (past 64 servers, backups, a slow server removed while
# requests to it are in flight) and one reload; fails unless every process's report says
# "ERROR SUMMARY: 0 errors" and no retired server is left. The Rust bench
# module/t/bench/live_memcheck.rs (its doc says how).
#
#   module/t/bench/live-memcheck.sh [PATH/TO/libngx_http_combined_upstreams_module.so]
#
# Environment: NGINX_BIN (default /usr/sbin/nginx), SECONDS_OF_LOAD (default 60), KEEP=1 keeps
# the valgrind logs (directory printed).
set -euo pipefail
cd "$(dirname "$0")/../../.."
. module/t/bench/cargo-bench.sh
run_bench live_memcheck "${1:-$PWD/target/release/libngx_http_combined_upstreams_module.so}"
