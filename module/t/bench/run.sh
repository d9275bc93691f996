#!/usr/bin/env bash
# Benchmark of the combined-upstreams module against hand-written nginx configuration, both
# measured in the same run on this machine (compare the ratios, not the absolute numbers).
#
#   module/t/bench/run.sh            # after: cargo build --release -p ngx-combined-upstreams
#
# 1. Requests per second (wrk) through an upstream built with add_upstream vs the same servers
#    written by hand: both wrk run at the same time in each round (half the connections each);
#    the median of the per-round ratios is reported.                       Target ratio >= 0.98.
# 2. `nginx -t` time for 1,000 upstreams built with add_upstream vs the same 1,000 upstreams
#    written out by hand (both configurations load the module), CPU time, median of TRIES runs.  Target <= 1.2.
#
# Environment: COMBINED_UPSTREAMS_MODULE (the .so), NGINX_BIN (default /usr/sbin/nginx),
# ROUNDS (default 5), DURATION (wrk seconds per round, default 5), CONNS (default 32), TRIES (default 15).
set -euo pipefail
cd "$(dirname "$0")/../../.."
SO="${COMBINED_UPSTREAMS_MODULE:-$PWD/target/release/libngx_http_combined_upstreams_module.so}"
NGINX="${NGINX_BIN:-/usr/sbin/nginx}"
ROUNDS="${ROUNDS:-5}"; DURATION="${DURATION:-5}"; CONNS="${CONNS:-32}"; TRIES="${TRIES:-15}"
[ -f "$SO" ] || { echo "bench: module not found at $SO (cargo build --release -p ngx-combined-upstreams)" >&2; exit 1; }
command -v wrk >/dev/null || { echo "bench: wrk not found (apt-get install wrk)" >&2; exit 1; }

DIR="$(mktemp -d)"
PID=""
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
mkdir -p "$DIR/logs" "$DIR/tmp"

# free loopback ports: front + 4 backends (a port is free when nothing accepts a connection on it)
free_port() {
  local p
  while :; do
    p=$((12000 + RANDOM % 20000))   # below Linux's ephemeral range (32768+)
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}
P0=$(free_port); P1=$(free_port); P2=$(free_port); P3=$(free_port); P4=$(free_port)

head_conf() {
  cat <<CONF
load_module $SO;
worker_processes 1;
error_log $DIR/logs/error.log warn;
pid $DIR/logs/nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $DIR/tmp/body; proxy_temp_path $DIR/tmp/proxy;
  fastcgi_temp_path $DIR/tmp/fastcgi; uwsgi_temp_path $DIR/tmp/uwsgi; scgi_temp_path $DIR/tmp/scgi;
CONF
}

# ---- 1. requests per second ----------------------------------------------------------------
{
  head_conf
  cat <<CONF
  server { listen 127.0.0.1:$P1; return 200 "b1"; }
  server { listen 127.0.0.1:$P2; return 200 "b2"; }
  server { listen 127.0.0.1:$P3; return 200 "b3"; }
  server { listen 127.0.0.1:$P4; return 200 "b4"; }
  upstream a { server 127.0.0.1:$P1; server 127.0.0.1:$P2 weight=2; }
  upstream b { server 127.0.0.1:$P3; server 127.0.0.1:$P4; }
  upstream combined { add_upstream a; add_upstream b weight=3; keepalive 16; }
  upstream hand {
    server 127.0.0.1:$P1; server 127.0.0.1:$P2 weight=2;
    server 127.0.0.1:$P3 weight=3; server 127.0.0.1:$P4 weight=3;
    keepalive 16;
  }
  server {
    listen 127.0.0.1:$P0;
    proxy_http_version 1.1; proxy_set_header Connection "";
    location /combined { proxy_pass http://combined; }
    location /hand { proxy_pass http://hand; }
  }
}
CONF
} > "$DIR/rps.conf"

"$NGINX" -p "$DIR" -e "$DIR/logs/error.log" -c "$DIR/rps.conf" -g 'daemon off;' &
PID=$!
for _ in $(seq 100); do
  curl -s -o /dev/null "http://127.0.0.1:$P0/hand" && break
  kill -0 "$PID" 2>/dev/null || { echo "bench: nginx did not start" >&2; exit 1; }
  sleep 0.05
done
wrk_rps() { wrk -t1 -c"$((CONNS / 2))" -d"${DURATION}s" "http://127.0.0.1:$P0/$1" | awk '/Requests\/sec/ {print $2}'; }
wrk_rps hand >/dev/null; wrk_rps combined >/dev/null   # warm-up
# Each round runs both wrk at the same time against the same nginx worker, so load from anything
# else on the machine hits both alike; the per-round ratio is what matters.
HAND=(); COMB=(); RATIO=()
for r in $(seq "$ROUNDS"); do
  wrk_rps hand > "$DIR/hand.out" &
  W1=$!
  wrk_rps combined > "$DIR/comb.out" &
  W2=$!
  wait "$W1" "$W2"
  HAND+=("$(cat "$DIR/hand.out")"); COMB+=("$(cat "$DIR/comb.out")")
  RATIO+=("$(awk -v a="${COMB[-1]}" -v b="${HAND[-1]}" 'BEGIN { printf "%.3f", a / b }')")
  echo "round $r: hand ${HAND[-1]} req/s, add_upstream ${COMB[-1]} req/s, ratio ${RATIO[-1]}"
done
kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
H="$(median "${HAND[@]}")"; C="$(median "${COMB[@]}")"

# ---- 2. nginx -t with 1,000 upstreams --------------------------------------------------------
N=1000
gen() { # $1 = combined|hand
  head_conf
  for s in $(seq 0 9); do
    echo "  upstream src$s { server 127.0.0.$((s + 1)):80 weight=2 max_fails=3; server 127.0.0.$((s + 1)):81; }"
  done
  for i in $(seq 0 $((N - 1))); do
    a=$((i % 10)); b=$(((i + 1) % 10))
    if [ "$1" = combined ]; then
      echo "  upstream u$i { add_upstream src$a; add_upstream src$b weight=2 backup; }"
    else
      echo "  upstream u$i { server 127.0.0.$((a + 1)):80 weight=2 max_fails=3; server 127.0.0.$((a + 1)):81;" \
           "server 127.0.0.$((b + 1)):80 weight=4 max_fails=3 backup; server 127.0.0.$((b + 1)):81 weight=2 backup; }"
    fi
  done
  echo "}"
}
gen combined > "$DIR/t-combined.conf"
gen hand > "$DIR/t-hand.conf"
time_t() { # CPU seconds (user + sys) of one nginx -t: steadier than wall time on a shared machine
  local t
  t=$( { TIMEFORMAT='%3U %3S'; time "$NGINX" -t -q -p "$DIR" -e "$DIR/logs/error.log" -c "$DIR/$1" >/dev/null 2>&1; } 2>&1 ) \
    || { echo "bench: nginx -t failed on $1" >&2; exit 1; }
  awk -v t="$t" 'BEGIN { split(t, a, " "); printf "%.4f\n", a[1] + a[2] }'
}
TH=(); TC=()
for _ in $(seq "$TRIES"); do TH+=("$(time_t t-hand.conf)"); TC+=("$(time_t t-combined.conf)"); done
TMH="$(median "${TH[@]}")"; TMC="$(median "${TC[@]}")"

echo
printf '%-46s %12s %12s %8s\n' "measure" "hand" "module" "ratio"

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
printf '%-46s %12.0f %12.0f %8s\n' "req/s through the upstream (median, wrk)" "$H" "$C" "$(median "${RATIO[@]}")"
printf '%-46s %12.4f %12.4f %8s\n' "nginx -t CPU seconds, $N upstreams (median)" "$TMH" "$TMC" "$(ratio "$TMC" "$TMH")"
