#!/usr/bin/env bash
# Instructions per request of the nginx worker under valgrind's callgrind for upstrand requests, as
# ratios to a plain `proxy_pass` measured in the same run: a deterministic figure beside the req/s of
# upstrand.sh, which a shared machine cannot resolve to a few percent.
#
#   module/t/bench/callgrind.sh [PATH/TO/libngx_http_combined_upstreams_module.so]
#
# Default .so: target/release/libngx_http_combined_upstreams_module.so (cargo build --release -p
# ngx-combined-upstreams). Needs valgrind (callgrind_control) and curl.
#
# Two nginx: the backends (`return` servers) run normally; the front nginx runs as one process
# (`master_process off`: the process is the worker) under `valgrind --tool=callgrind
# --instr-atstart=no`. After a warm-up with instrumentation off (keep-alive connections to the
# backends are open, pools allocated), instrumentation is switched on and for each endpoint:
# `callgrind_control -z` (zero), REQUESTS requests over one keep-alive connection (curl), every
# answer checked to be 200, `callgrind_control -d` (dump); the dump's `totals:` (Ir) divided by
# REQUESTS is the instructions per request. Endpoints, as in upstrand.sh:
#   plain      proxy_pass http://ok;                      (baseline)
#   var        set $u ok; proxy_pass http://$u;           (nginx's own cost of a variable proxy_pass)
#   first      upstrand whose first upstream answers 200
#   hop        one failover hop 503 -> 200                target ratio < 2
#   intercept  both upstreams 503, then the intercept_statuses location
#   live       proxy_pass to a live upstream (a `zone`, made live by the `upstreams_api` location): the
#              balancer wrapper and the per-server statistics counters (issue 24)
# BASE_SO=PATH measures every endpoint again, in the same run, with a second module (e.g. a build without
# the statistics counters) under a second front nginx, and prints each endpoint's ratio with SO to BASE_SO.
# ROUNDS (default 2) repeats the endpoint cycle (the figures of a round differ by a few Ir per request).
# ANNOTATE=1 also prints callgrind_annotate's top functions of the last hop dump; KEEP=FILE copies that
# dump to FILE (for `callgrind_annotate --inclusive=yes FILE`, kcachegrind).
# Environment: NGINX_BIN (default /usr/sbin/nginx), REQUESTS (default 1000), ROUNDS, ANNOTATE, KEEP, BASE_SO.
set -euo pipefail
cd "$(dirname "$0")/../../.."
SO="${1:-$PWD/target/release/libngx_http_combined_upstreams_module.so}"
SO="$(readlink -f "$SO")"
NGINX="${NGINX_BIN:-/usr/sbin/nginx}"
REQUESTS="${REQUESTS:-1000}"; ROUNDS="${ROUNDS:-2}"; ANNOTATE="${ANNOTATE:-0}"
[ -f "$SO" ] || { echo "callgrind: module not found at $SO (cargo build --release -p ngx-combined-upstreams)" >&2; exit 1; }
BASE_SO="${BASE_SO:-}"
if [ -n "$BASE_SO" ]; then
  BASE_SO="$(readlink -f "$BASE_SO")"
  [ -f "$BASE_SO" ] || { echo "callgrind: BASE_SO not found" >&2; exit 1; }
fi
for t in valgrind callgrind_control curl; do
  command -v "$t" >/dev/null || { echo "callgrind: $t not found (apt-get install valgrind curl)" >&2; exit 1; }
done

DIR="$(mktemp -d)"
VG=""; BACK=""
cleanup() {
  [ -n "$VG" ] && kill "$VG" 2>/dev/null
  [ -n "$BACK" ] && kill "$BACK" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$DIR"
}
trap cleanup EXIT
mkdir -p "$DIR/back/logs" "$DIR/back/tmp" "$DIR/front/logs" "$DIR/front/tmp" "$DIR/cg"

free_port() { # a loopback port nothing accepts on, below the ephemeral range
  local p
  while :; do
    p=$((12000 + RANDOM % 20000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}
P0=$(free_port); P1=$(free_port); P2=$(free_port); P3=$(free_port)

temp_paths() { # $1 = prefix
  echo "client_body_temp_path $1/tmp/body; proxy_temp_path $1/tmp/proxy; fastcgi_temp_path $1/tmp/f;"
  echo "uwsgi_temp_path $1/tmp/u; scgi_temp_path $1/tmp/s;"
}

cat > "$DIR/back/nginx.conf" <<CONF
worker_processes 1;
error_log $DIR/back/logs/error.log warn;
pid $DIR/back/logs/nginx.pid;
events { worker_connections 1024; }
http {
  access_log off; $(temp_paths "$DIR/back")
  server { listen 127.0.0.1:$P1; return 200 "ok\n"; }
  server { listen 127.0.0.1:$P2; return 503 "busy\n"; }
  server { listen 127.0.0.1:$P3; return 503 "busy too\n"; }
}
CONF

front_conf() { # $1 = module
cat > "$DIR/front/nginx.conf" <<CONF
load_module $1;
daemon off;
master_process off;
worker_processes 1;
error_log $DIR/front/logs/error.log warn;
pid $DIR/front/logs/nginx.pid;
events { worker_connections 1024; }
http {
  access_log off; $(temp_paths "$DIR/front")
  upstream ok    { server 127.0.0.1:$P1; keepalive 8; }
  upstream busy  { server 127.0.0.1:$P2; keepalive 8; }
  upstream busy2 { server 127.0.0.1:$P3; keepalive 8; }
  upstream live  { zone live 64k; server 127.0.0.1:$P1; keepalive 8; }
  upstrand first     { upstream ok; upstream busy; order per_request; next_upstream_statuses 5xx; }
  upstrand hop       { upstream busy; upstream ok; order per_request; next_upstream_statuses 5xx; }
  upstrand intercept { upstream busy; upstream busy2; order per_request; next_upstream_statuses 5xx;
                       intercept_statuses 5xx /failover; }
  server {
    listen 127.0.0.1:$P0;
    keepalive_requests 1000000;
    proxy_http_version 1.1; proxy_set_header Connection "";
    location /plain     { proxy_pass http://ok; }
    location /var       { set \$u ok; proxy_pass http://\$u; }
    location /first     { proxy_pass http://\$upstrand_first; }
    location /hop       { proxy_pass http://\$upstrand_hop; }
    location /intercept { proxy_pass http://\$upstrand_intercept; }
    location /failover  { internal; return 200 "failover\n"; }
    location /live      { proxy_pass http://live; }
    location /api/      { upstreams_api; }
  }
}
CONF
}

"$NGINX" -p "$DIR/back" -e "$DIR/back/logs/error.log" -c "$DIR/back/nginx.conf" -g 'daemon off;' &
BACK=$!
start_front() { # $1 = module, $2 = tag of its dumps
  front_conf "$1"
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$DIR/cg/$2" \
    "$NGINX" -p "$DIR/front" -e "$DIR/front/logs/error.log" -c "$DIR/front/nginx.conf" \
    >"$DIR/valgrind.log" 2>&1 &
  VG=$!
  for _ in $(seq 600); do
    curl -s -o /dev/null "http://127.0.0.1:$P0/plain" && curl -s -o /dev/null "http://127.0.0.1:$P1/" && break
    kill -0 "$VG" 2>/dev/null || { echo "callgrind: nginx under valgrind did not start:" >&2; cat "$DIR/valgrind.log" >&2; exit 1; }
    sleep 0.1
  done
}
stop_front() {
  kill "$VG" 2>/dev/null; wait "$VG" 2>/dev/null || true; VG=""
}

ENDPOINTS="plain var first hop intercept live"
requests() { # endpoint count: COUNT requests on one connection; fails unless every answer is 200
  local codes
  codes=$(curl -s -o /dev/null -w '%{http_code}\n' "http://127.0.0.1:$P0/$1?i=[1-$2]")
  if [ "$(grep -c '^200$' <<<"$codes")" != "$2" ]; then
    echo "callgrind: /$1 answered $(sort <<<"$codes" | uniq -c | tr '\n' ' ')" >&2
    exit 1
  fi
}
control() { callgrind_control "$@" "$VG" >/dev/null 2>&1; }

declare -A IR
measure() { # $1 = module, $2 = tag: fills IR[<tag>:<endpoint>]
  start_front "$1" "$2"
  for e in $ENDPOINTS; do requests "$e" 20; done # warm-up, uninstrumented
  control -i on
  for e in $ENDPOINTS; do requests "$e" 5; done  # warm-up of the instrumented code paths
  local dump=0 r e file total per line
  for r in $(seq "$ROUNDS"); do
    line="$2 round $r:"
    for e in $ENDPOINTS; do
      control -z
      requests "$e" "$REQUESTS"
      control -d "$e"
      dump=$((dump + 1))
      file="$DIR/cg/$2.$dump"
      for _ in $(seq 100); do [ -s "$file" ] && grep -q '^totals:' "$file" && break; sleep 0.1; done
      total=$(awk '/^totals:/ {print $2}' "$file")
      [ -n "$total" ] || { echo "callgrind: no totals in dump $file" >&2; exit 1; }
      per=$((total / REQUESTS))
      IR[$2:$e]+="$per "
      line+=" $e $per"
      [ "$e" = hop ] && [ "$2" = so ] && cp "$file" "$DIR/hop.out"
    done
    echo "$line Ir/request"
  done
  stop_front
}
measure "$SO" so
[ -n "$BASE_SO" ] && measure "$BASE_SO" base

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : int((a[NR/2]+a[NR/2+1])/2)}'; }
echo
echo "module: $SO"
echo "instructions (Ir) per request of the nginx worker, $REQUESTS requests per endpoint, median of $ROUNDS rounds"
# shellcheck disable=SC2086
base=$(median ${IR[so:plain]})
printf '%-40s %12s %7s %7s\n' "endpoint" "Ir/request" "ratio" "target"
row() { # label key target
  local v
  # shellcheck disable=SC2086
  v=$(median ${IR[so:$2]})
  printf '%-40s %12d %7s %7s\n' "$1" "$v" "$(awk -v a="$v" -v b="$base" 'BEGIN { printf "%.3f", a / b }')" "$3"
}
row "plain proxy_pass (baseline)" plain "-"
row "proxy_pass http://\$u (set \$u ok)" var "report"
row "upstrand, first upstream answers 200" first "report"
row "upstrand, one failover hop 503 -> 200" hop "< 2"
row "upstrand, 503, 503, intercept location" intercept "report"
row "live upstream (zone, upstreams_api)" live "report"

if [ -n "$BASE_SO" ]; then
  echo
  echo "the same endpoints with BASE_SO=$BASE_SO (same run): Ir/request, and SO / BASE_SO"
  printf '%-12s %12s %12s %9s\n' "endpoint" "SO" "BASE_SO" "ratio"
  for e in $ENDPOINTS; do
    # shellcheck disable=SC2086
    a=$(median ${IR[so:$e]}); b=$(median ${IR[base:$e]})
    printf '%-12s %12d %12d %9s\n' "$e" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.4f", a / b }')"
  done
fi

[ -n "${KEEP:-}" ] && cp "$DIR/hop.out" "$KEEP" && echo "hop dump kept in $KEEP"
if [ "$ANNOTATE" = 1 ]; then
  echo
  echo "top functions of the hop endpoint (callgrind_annotate, self cost):"
  callgrind_annotate "$DIR/hop.out" 2>/dev/null | sed -n '/Ir/,$p' | head -40
fi
