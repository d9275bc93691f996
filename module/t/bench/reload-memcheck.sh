#!/usr/bin/env bash
# nginx reloaded under load with the module, every process under valgrind memcheck.
#
#   module/t/bench/reload-memcheck.sh            # after: cargo build --release -p ngx-combined-upstreams
#
# Runs the ignored case `reload::reload_under_load_memcheck` of module/t/tests/e2e/reload/: nginx with
# `master_process on` and 2 workers starts under
#   valgrind --tool=memcheck --trace-children=yes --child-silent-after-fork=no --num-callers=40
#            --error-limit=no --leak-check=full --errors-for-leak-kinds=definite
#            --suppressions=module/t/valgrind/nginx-1.22.supp --log-file=DIR/vg.%p.log
# (workers are forks of the master, so they run under valgrind too, each with its own log), wrk
# sends constant traffic through upstrand and dynamic_upstrand, and the master is reloaded RELOADS
# times with a configuration that changes each time. The case fails unless every process's log
# says `ERROR SUMMARY: 0 errors` (invalid accesses, uninitialised values, definite leaks other than
# nginx 1.22's own, listed in the suppression file) and every answer is explained by its
# configuration. The figures and each process's ERROR SUMMARY are printed.
#
# Environment: RELOADS (default 12), COMBINED_UPSTREAMS_MODULE, NGINX_BIN, VALGRIND_LOGS=DIR keeps
# the valgrind logs in DIR.
set -euo pipefail
cd "$(dirname "$0")/../../.."
SO="${COMBINED_UPSTREAMS_MODULE:-$PWD/target/release/libngx_http_combined_upstreams_module.so}"
[ -f "$SO" ] || { echo "reload-memcheck: module not found at $SO (cargo build --release -p ngx-combined-upstreams)" >&2; exit 1; }
for t in valgrind wrk; do
  command -v "$t" >/dev/null || { echo "reload-memcheck: $t not found (scripts/setup.sh)" >&2; exit 1; }
done
export RELOADS="${RELOADS:-12}"
exec cargo nextest run -p combined-upstreams-tests --run-ignored only --no-capture \
  -E 'binary(e2e) & test(=reload::reload_under_load_memcheck)'
