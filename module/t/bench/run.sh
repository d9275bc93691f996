#!/usr/bin/env bash
# The module benchmark against hand-written nginx configuration, measured in the same run: req/s
# through add_upstream vs the same servers by hand (target ratio >= 0.98) and `nginx -t` CPU time
# with 1,000 upstreams (target <= 1.2). The Rust bench module/t/bench/run.rs (its doc says how).
#
#   module/t/bench/run.sh            # after: cargo build --release -p ngx-combined-upstreams
#
# Environment: COMBINED_UPSTREAMS_MODULE (the .so), NGINX_BIN (default /usr/sbin/nginx),
# ROUNDS (default 5), DURATION (wrk seconds per round, default 5), CONNS (default 32), TRIES (default 15).
set -euo pipefail
cd "$(dirname "$0")/../../.."
. module/t/bench/cargo-bench.sh
run_bench run
