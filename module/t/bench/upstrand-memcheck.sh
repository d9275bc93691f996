#!/usr/bin/env bash
# Robustness of the upstrand FFI code (issue 4, point 9):
#  1. valgrind memcheck: nginx (single process) with the module runs every upstrand scenario a few
#     hundred times; the report must show no invalid read/write/free and no use of uninitialised
#     memory (the script fails if valgrind reports any error at all).
#  2. RSS: a plain nginx worker serves REQUESTS requests through a failover walk (503 -> 200); the
#     worker's RSS after 10% of them and at the end are printed (flat = no per-request leak).
#
#   module/t/bench/upstrand-memcheck.sh [PATH/TO/libngx_http_combined_upstreams_module.so]
#
# Environment: NGINX_BIN (default /usr/sbin/nginx), PER_SCENARIO (default 200), REQUESTS (default
# 100000), KEEP=1 keeps the valgrind log (path printed).
set -euo pipefail
cd "$(dirname "$0")/../../.."
SO="$(readlink -f "${1:-$PWD/target/release/libngx_http_combined_upstreams_module.so}")"
NGINX="${NGINX_BIN:-/usr/sbin/nginx}"
PER_SCENARIO="${PER_SCENARIO:-200}"; REQUESTS="${REQUESTS:-100000}"
[ -f "$SO" ] || { echo "memcheck: module not found at $SO" >&2; exit 1; }
for t in valgrind wrk curl python3; do
  command -v "$t" >/dev/null || { echo "memcheck: $t not found" >&2; exit 1; }
done
ECHO_SO=/usr/lib/nginx/modules/ngx_http_echo_module.so
[ -f "$ECHO_SO" ] || { echo "memcheck: $ECHO_SO not found (apt-get install libnginx-mod-http-echo)" >&2; exit 1; }

DIR="$(mktemp -d)"
PID=""; HOLE=""
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null
  [ -n "$HOLE" ] && kill "$HOLE" 2>/dev/null
  wait 2>/dev/null
  [ "${KEEP:-0}" = 1 ] || rm -rf "$DIR"
}
trap cleanup EXIT
mkdir -p "$DIR/logs" "$DIR/tmp" "$DIR/html"

free_port() {
  local p
  while :; do
    p=$((12000 + RANDOM % 20000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}
P0=$(free_port); P1=$(free_port); P2=$(free_port); P3=$(free_port); P4=$(free_port)
P5=$(free_port); P6=$(free_port); PH=$(free_port); PD=$(free_port)

# A black hole: accepts connections (backlog), never answers -> nginx-made 504.
python3 -c "import socket,time; s=socket.socket(); s.bind(('127.0.0.1',$PH)); s.listen(512); time.sleep(1e6)" &
HOLE=$!
head -c 1048576 /dev/zero | tr '\0' 'x' > "$DIR/html/big.txt"
cp "$DIR/html/big.txt" "$DIR/html/err.txt"

conf() { # $1 = main-context extra lines
  cat <<CONF
load_module $SO;
load_module $ECHO_SO;
$1
error_log $DIR/logs/error.log warn;
pid $DIR/logs/nginx.pid;
events { worker_connections 1024; }
http {
  log_format us '\$request_uri \$status \$upstrand_path|\$upstrand_addr|\$upstrand_status|\$upstrand_cache_status|\$upstrand_connect_time|\$upstrand_header_time|\$upstrand_response_length|\$upstrand_response_time';
  access_log $DIR/logs/access.log us;
  client_body_temp_path $DIR/tmp/body; proxy_temp_path $DIR/tmp/proxy;
  fastcgi_temp_path $DIR/tmp/fastcgi; uwsgi_temp_path $DIR/tmp/uwsgi; scgi_temp_path $DIR/tmp/scgi;
  proxy_read_timeout 200ms;
  server { listen 127.0.0.1:$P1; location / { return 503 "u01 503\n"; } }
  server { listen 127.0.0.1:$P2; location / { add_header X-Accel-Redirect /plain; return 502 "u02 502\n"; } }
  server { listen 127.0.0.1:$P3; location / { echo_read_request_body; echo "u03 \$request_method \$request_body"; }
                                 location /ssi { return 200 "[<!--# include virtual=\"/plain\" -->]"; } }
  server { listen 127.0.0.1:$P4; root $DIR/html; location / { error_page 503 /err.txt; return 503; } location = /err.txt { internal; } }
  server { listen 127.0.0.1:$P5; root $DIR/html; }
  server { listen 127.0.0.1:$P6; location / { return 200 "b01 200\n"; } }
  upstream u01 { server 127.0.0.1:$P1; }
  upstream u02 { server 127.0.0.1:$P2; }
  upstream u03 { server 127.0.0.1:$P3; keepalive 8; }
  upstream b01 { server 127.0.0.1:$P6; }
  upstream err { server 127.0.0.1:$P4; }
  upstream big { server 127.0.0.1:$P5; }
  upstream hole { server 127.0.0.1:$PH; }
  upstream dead { server 127.0.0.1:$PD; }
  upstream s { server 127.0.0.1:$PD; server 127.0.0.1:$P3; combine_server_singlets _single_ nobackup; }
  upstrand walk { upstream ~^u0; upstream b01 backup; order per_request; next_upstream_statuses error timeout non_idempotent 5xx; }
  upstrand rr { upstream ~^u0; upstream b01 backup; order start_random; next_upstream_statuses 5xx; }
  upstrand rnd { upstream ~^u0; upstream b01 backup; order start_random per_request; next_upstream_statuses 5xx; }
  upstrand bl { upstream u01 blacklist_interval=50ms; upstream u02 blacklist_interval=50ms; order per_request; next_upstream_statuses 5xx; }
  upstrand ic { upstream u01; upstream u02; order per_request; next_upstream_statuses 5xx; intercept_statuses 5xx /failover; }
  upstrand tmo { upstream hole; upstream dead; upstream u03; order per_request; next_upstream_statuses error timeout; next_upstream_timeout 100ms; intercept_statuses 504 /failover; }
  upstrand large { upstream err; upstream big; order per_request; next_upstream_statuses 503; }
  upstrand first { upstream u03; upstream u01; next_upstream_statuses 5xx; }
  upstrand single { upstream ~^s_single_; order per_request; next_upstream_statuses error; }
  upstrand post { upstream u01; upstream u03; order per_request; next_upstream_statuses 503; }
  server {
    listen 127.0.0.1:$P0;
    proxy_http_version 1.1; proxy_set_header Connection "";
    dynamic_upstrand \$dus1 \$arg_a walk;
    location /walk { proxy_pass http://\$upstrand_walk; }
    location /rr { proxy_pass http://\$upstrand_rr; }
    location /rnd { proxy_pass http://\$upstrand_rnd; }
    location /bl { proxy_pass http://\$upstrand_bl; }
    location /ic { proxy_pass http://\$upstrand_ic; }
    location /tmo { proxy_pass http://\$upstrand_tmo; }
    location /big.txt { proxy_pass http://\$upstrand_large; }
    location /nobuf/ { proxy_buffering off; proxy_pass http://\$upstrand_large; }
    location /gz { gzip on; gzip_min_length 1; gzip_types text/plain; proxy_pass http://\$upstrand_walk; }
    location /ep { error_page 502 503 504 /plain; proxy_intercept_errors on; proxy_pass http://\$upstrand_walk; }
    location /ssi { ssi on; ssi_types text/plain; proxy_pass http://\$upstrand_first; }
    location /single { proxy_pass http://\$upstrand_single; }
    location /post { proxy_pass http://\$upstrand_post; }
    location /two { set \$x \$upstrand_rr; proxy_pass http://\$upstrand_walk; }
    location /name { return 200 "\$upstrand_rr\n"; }
    location /hdr { add_header X-Us \$upstrand_walk always; add_header X-Path \$upstrand_path always;
                    add_header X-St \$upstrand_status always; proxy_pass http://\$upstrand_walk; }
    location /hdric { add_header X-Us \$upstrand_ic always; add_header X-Path \$upstrand_path always;
                      add_header X-St \$upstrand_status always; proxy_pass http://\$upstrand_ic; }
    location /dyn { dynamic_upstrand \$dus2 \$arg_b; if (\$arg_b) { proxy_pass http://\$dus2; break; } proxy_pass http://\$dus1; }
    location /plain { return 200 "plain\n"; }
    location /failover { internal; try_files /none @fo; }
    location @fo { error_page 404 = @fo2; return 404; }
    location @fo2 { return 503 "failover\n"; }
  }
}
CONF
}

wait_up() {
  for _ in $(seq 600); do
    curl -s -o /dev/null "http://127.0.0.1:$P0/plain" && return 0
    kill -0 "$PID" 2>/dev/null || { echo "memcheck: nginx did not start"; cat "$DIR/logs/error.log"; exit 1; } >&2
    sleep 0.1
  done
  echo "memcheck: nginx did not answer" >&2; exit 1
}

# ---- 1. valgrind ----------------------------------------------------------------------------
conf "daemon off; master_process off;" > "$DIR/vg.conf"
valgrind --tool=memcheck --num-callers=40 --error-limit=no --log-file="$DIR/valgrind.log" \
  "$NGINX" -p "$DIR" -e "$DIR/logs/error.log" -c "$DIR/vg.conf" &
PID=$!
wait_up
U="http://127.0.0.1:$P0"
run() { # N URL [curl args...]: N requests, 4 at a time
  local n=$1 url=$2; shift 2
  seq "$n" | xargs -P4 -I{} curl -s -o /dev/null -m 20 "$@" "$url" || true
}
start=$(date +%s)
for path in /walk /rr /rnd /bl /ic /tmo /big.txt /nobuf/big.txt /ep /ssi/x /single /two /name /hdr /hdric \
            "/dyn" "/dyn?a=rr" "/dyn?b=ic" "/dyn?b=nope" "/dyn?a=NOPE"; do
  run "$PER_SCENARIO" "$U$path"
done
run "$PER_SCENARIO" "$U/gz" -H "Accept-Encoding: gzip"
run "$PER_SCENARIO" "$U/walk" -I
run "$PER_SCENARIO" "$U/post" -d "k=v"
run "$PER_SCENARIO" "$U/walk" -X POST -d "k=v"
run "$PER_SCENARIO" "$U/big.txt" -m 0.05            # clients that give up mid-answer
# keep-alive: four walks on one connection
seq 20 | xargs -P4 -I{} curl -s -o /dev/null "$U/walk" -o /dev/null "$U/big.txt" -o /dev/null "$U/ic" -o /dev/null "$U/walk" || true
echo "valgrind phase: $(wc -l < "$DIR/logs/access.log") requests (front and backend) in $(( $(date +%s) - start )) s"
kill -QUIT "$PID"; wait "$PID" 2>/dev/null || true; PID=""
summary=$(grep "ERROR SUMMARY" "$DIR/valgrind.log" | tail -1)
echo "valgrind: $summary"
kinds=$(grep -E "Invalid (read|write|free)|uninitialised|Mismatched free|overlap" "$DIR/valgrind.log" | sed 's/^==[0-9]*== //' | sort | uniq -c || true)
ours=$(grep -c "combined_upstreams\|upstrand" "$DIR/valgrind.log" || true)
echo "valgrind: error kinds: ${kinds:-none}; stack frames naming the module: $ours"
[ "${KEEP:-0}" = 1 ] && echo "valgrind log: $DIR/valgrind.log"
grep -q "ERROR SUMMARY: 0 errors" <<<"$summary" || { echo "memcheck: valgrind reported errors" >&2; exit 1; }

# ---- 2. RSS over REQUESTS requests through a failover walk ------------------------------------
: > "$DIR/logs/access.log"
conf "worker_processes 1; daemon off;" | sed 's#access_log .*/logs/access.log us;#access_log off;#' > "$DIR/rss.conf"
"$NGINX" -p "$DIR" -e "$DIR/logs/error.log" -c "$DIR/rss.conf" &
PID=$!
wait_up
worker=$(pgrep -P "$PID" | head -1)
rss() { awk '/VmRSS/ {print $2}' "/proc/$worker/status"; }
# u01 503 -> u02 502 -> u03 200: a walk of three upstreams per request.
wrk_n() { # run wrk until about $1 more requests were served
  local n=$1 done_n=0 out got
  while [ "$done_n" -lt "$n" ]; do
    out=$(wrk -t1 -c16 -d1s "$U/walk")
    got=$(awk '/requests in/ {print $1}' <<<"$out")
    done_n=$((done_n + got))
  done
  echo "$done_n"
}
first=$(wrk_n $((REQUESTS / 10)))
r1=$(rss)
rest=$(wrk_n $((REQUESTS - first)))
r2=$(rss)
echo "RSS of the worker: $r1 kB after $first walks, $r2 kB after $((first + rest)) walks (u01 503 -> u02 502 -> u03 200)"
kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""
