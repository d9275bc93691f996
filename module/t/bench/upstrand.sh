#!/usr/bin/env bash
# Benchmark of upstrand request handling (issue 4), as ratios against plain `proxy_pass` to the same
# backend measured in the same run (compare the ratios, not the absolute numbers).
#
#   module/t/bench/upstrand.sh [PATH/TO/libngx_http_combined_upstreams_module.so]
#
# Default .so: target/release/libngx_http_combined_upstreams_module.so (cargo build --release -p
# ngx-combined-upstreams). Passing another .so compares builds with the same script.
#
# One nginx worker pinned to CPU 0 (worker_cpu_affinity), wrk pinned to CPU 1 (taskset). Backends are
# `return` servers of the same nginx, reached over keep-alive connections. Endpoints:
#   plain      proxy_pass http://ok;                      (baseline)
#   first      upstrand whose first upstream answers 200  target ratio >= 0.95
#   hop        one failover hop 503 -> 200                target ratio >= 0.45
#   intercept  both upstreams 503, then the intercept_statuses location (reported)
# Each round measures the four endpoints one after the other (DURATION seconds each) and computes
# ratios against that round's baseline; the table shows medians over ROUNDS.
# Environment: NGINX_BIN (default /usr/sbin/nginx), ROUNDS (default 5), DURATION (default 5),
# CONNS (default 32).
set -euo pipefail
cd "$(dirname "$0")/../../.."
SO="${1:-$PWD/target/release/libngx_http_combined_upstreams_module.so}"
SO="$(readlink -f "$SO")"
NGINX="${NGINX_BIN:-/usr/sbin/nginx}"
ROUNDS="${ROUNDS:-5}"; DURATION="${DURATION:-5}"; CONNS="${CONNS:-32}"
[ -f "$SO" ] || { echo "bench: module not found at $SO (cargo build --release -p ngx-combined-upstreams)" >&2; exit 1; }
command -v wrk >/dev/null || { echo "bench: wrk not found (apt-get install wrk)" >&2; exit 1; }
command -v taskset >/dev/null || { echo "bench: taskset not found (apt-get install util-linux)" >&2; exit 1; }
[ "$(nproc)" -ge 2 ] || { echo "bench: needs 2 CPUs (nginx and wrk on separate cores)" >&2; exit 1; }

DIR="$(mktemp -d)"
PID=""
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
mkdir -p "$DIR/logs" "$DIR/tmp"

free_port() { # a loopback port nothing accepts on, below the ephemeral range
  local p
  while :; do
    p=$((12000 + RANDOM % 20000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}
P0=$(free_port); P1=$(free_port); P2=$(free_port); P3=$(free_port)

cat > "$DIR/nginx.conf" <<CONF
load_module $SO;
worker_processes 1;
worker_cpu_affinity 01;
error_log $DIR/logs/error.log warn;
pid $DIR/logs/nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $DIR/tmp/body; proxy_temp_path $DIR/tmp/proxy;
  fastcgi_temp_path $DIR/tmp/fastcgi; uwsgi_temp_path $DIR/tmp/uwsgi; scgi_temp_path $DIR/tmp/scgi;
  server { listen 127.0.0.1:$P1; return 200 "ok\n"; }
  server { listen 127.0.0.1:$P2; return 503 "busy\n"; }
  server { listen 127.0.0.1:$P3; return 503 "busy too\n"; }
  upstream ok    { server 127.0.0.1:$P1; keepalive 32; }
  upstream busy  { server 127.0.0.1:$P2; keepalive 32; }
  upstream busy2 { server 127.0.0.1:$P3; keepalive 32; }
  upstrand first     { upstream ok; upstream busy; order per_request; next_upstream_statuses 5xx; }
  upstrand hop       { upstream busy; upstream ok; order per_request; next_upstream_statuses 5xx; }
  upstrand intercept { upstream busy; upstream busy2; order per_request; next_upstream_statuses 5xx;
                       intercept_statuses 5xx /failover; }
  server {
    listen 127.0.0.1:$P0;
    proxy_http_version 1.1; proxy_set_header Connection "";
    location /plain     { proxy_pass http://ok; }
    location /first     { proxy_pass http://\$upstrand_first; }
    location /hop       { proxy_pass http://\$upstrand_hop; }
    location /intercept { proxy_pass http://\$upstrand_intercept; }
    location /failover  { internal; return 200 "failover\n"; }
  }
}
CONF

"$NGINX" -p "$DIR" -e "$DIR/logs/error.log" -c "$DIR/nginx.conf" -g 'daemon off;' &
PID=$!
for _ in $(seq 100); do
  curl -s -o /dev/null "http://127.0.0.1:$P0/plain" && break
  kill -0 "$PID" 2>/dev/null || { echo "bench: nginx did not start" >&2; exit 1; }
  sleep 0.05
done
for e in plain first hop intercept; do # every endpoint must answer 200 before measuring
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P0/$e")
  [ "$code" = 200 ] || { echo "bench: /$e answered $code" >&2; exit 1; }
done

wrk_rps() { # prints requests/s; fails on any non-2xx answer or socket error
  local out
  out=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" "http://127.0.0.1:$P0/$1")
  if grep -q "Non-2xx\|Socket errors" <<<"$out"; then echo "bench: /$1: $out" >&2; exit 1; fi
  awk '/Requests\/sec/ {print $2}' <<<"$out"
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }

DURATION_SAVED="$DURATION"; DURATION=2
for e in plain first hop intercept; do wrk_rps "$e" >/dev/null; done # warm-up
DURATION="$DURATION_SAVED"

declare -A RPS RAT
for r in $(seq "$ROUNDS"); do
  line="round $r:"
  for e in plain first hop intercept; do
    v=$(wrk_rps "$e")
    RPS[$e]+="$v "
    line+=" $e $v"
  done
  base=$(awk '{print $NF}' <<<"${RPS[plain]}")
  for e in first hop intercept; do
    RAT[$e]+="$(ratio "$(awk '{print $NF}' <<<"${RPS[$e]}")" "$base") "
  done
  echo "$line req/s"
done
kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""

echo
echo "module: $SO"
printf '%-44s %12s %8s %8s\n' "endpoint" "req/s" "ratio" "target"
# shellcheck disable=SC2086
printf '%-44s %12.0f %8s %8s\n' "plain proxy_pass (baseline)" "$(median ${RPS[plain]})" "1.000" "-"
# shellcheck disable=SC2086
printf '%-44s %12.0f %8s %8s\n' "upstrand, first upstream answers 200" "$(median ${RPS[first]})" "$(median ${RAT[first]})" ">=0.95"
# shellcheck disable=SC2086
printf '%-44s %12.0f %8s %8s\n' "upstrand, one failover hop 503 -> 200" "$(median ${RPS[hop]})" "$(median ${RAT[hop]})" ">=0.45"
# shellcheck disable=SC2086
printf '%-44s %12.0f %8s %8s\n' "upstrand, 503, 503, intercept location" "$(median ${RPS[intercept]})" "$(median ${RAT[intercept]})" "report"
