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
#   var        set $u ok; proxy_pass http://$u;           (reported: nginx's own cost of a variable
#              proxy_pass, which every upstrand request pays)
#   first      upstrand whose first upstream answers 200  target ratio >= 0.95
#   hop        one failover hop 503 -> 200                target ratio >= 0.45
#   intercept  both upstreams 503, then the intercept_statuses location (reported)
# Each round measures the four endpoints one after the other (DURATION seconds each) and computes
# ratios against that round's baseline; the table shows medians over ROUNDS. Two measures:
#   wrk req/s                 what the issue asks for; noisy when other work shares the machine;
#   req per worker CPU-second requests served / CPU time (user+sys) the nginx worker spent on them,
#                             read from /proc: the cost per request, steady on a busy machine.
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
    location /var       { set \$u ok; proxy_pass http://\$u; }
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
WORKER=$(pgrep -P "$PID" | head -1)
[ -n "$WORKER" ] || { echo "bench: no nginx worker process" >&2; exit 1; }
for e in plain var first hop intercept; do # every endpoint must answer 200 before measuring
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P0/$e")
  [ "$code" = 200 ] || { echo "bench: /$e answered $code" >&2; exit 1; }
done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$WORKER/stat"; }
wrk_rps() { # prints "REQ/S REQ-PER-WORKER-CPU-SECOND"; fails on any non-2xx answer or socket error
  local out t0 t1 n
  t0=$(cpu_ticks)
  out=$(taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" "http://127.0.0.1:$P0/$1")
  t1=$(cpu_ticks)
  if grep -q "Non-2xx\|Socket errors" <<<"$out"; then echo "bench: /$1: $out" >&2; exit 1; fi
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  awk -v rps="$(awk '/Requests\/sec/ {print $2}' <<<"$out")" -v n="$n" -v t=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" \
    'BEGIN { printf "%s %.0f\n", rps, (t > 0) ? n / (t / hz) : 0 }'
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }

DURATION_SAVED="$DURATION"; DURATION=2
for e in plain var first hop intercept; do wrk_rps "$e" >/dev/null; done # warm-up
DURATION="$DURATION_SAVED"

declare -A RPS RAT CPU CRAT
for r in $(seq "$ROUNDS"); do
  line="round $r:"
  for e in plain var first hop intercept; do
    read -r v c <<<"$(wrk_rps "$e")"
    RPS[$e]+="$v "; CPU[$e]+="$c "
    line+=" $e $v ($c/cpu-s)"
  done
  base=$(awk '{print $NF}' <<<"${RPS[plain]}"); cbase=$(awk '{print $NF}' <<<"${CPU[plain]}")
  for e in var first hop intercept; do
    RAT[$e]+="$(ratio "$(awk '{print $NF}' <<<"${RPS[$e]}")" "$base") "
    CRAT[$e]+="$(ratio "$(awk '{print $NF}' <<<"${CPU[$e]}")" "$cbase") "
  done
  echo "$line req/s"
done
kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""

echo
echo "module: $SO"
printf '%-40s %9s %7s %12s %7s %7s\n' "endpoint (medians)" "req/s" "ratio" "req/cpu-s" "ratio" "target"
row() { # label key target
  # shellcheck disable=SC2086
  printf '%-40s %9.0f %7s %12.0f %7s %7s\n' "$1" "$(median ${RPS[$2]})" "$3" "$(median ${CPU[$2]})" "$4" "$5"
}
row "plain proxy_pass (baseline)" plain 1.000 1.000 "-"
# shellcheck disable=SC2086
row "proxy_pass http://\$u (set \$u ok)" var "$(median ${RAT[var]})" "$(median ${CRAT[var]})" "report"
# shellcheck disable=SC2086
row "upstrand, first upstream answers 200" first "$(median ${RAT[first]})" "$(median ${CRAT[first]})" ">=0.95"
# shellcheck disable=SC2086
row "upstrand, one failover hop 503 -> 200" hop "$(median ${RAT[hop]})" "$(median ${CRAT[hop]})" ">=0.45"
# shellcheck disable=SC2086
row "upstrand, 503, 503, intercept location" intercept "$(median ${RAT[intercept]})" "$(median ${CRAT[intercept]})" "report"
