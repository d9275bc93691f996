#!/usr/bin/env bash
# Active health checks (`probe`, issue 21) under valgrind memcheck: nginx with `master_process on`
# and 2 workers (every process under memcheck) probes every 100 ms an upstream whose servers
# answer 200, 503, never (a listener that accepts and stays silent: timeouts) or refuse the
# connection, while PUTs replace the set every 200 ms (servers added, kept, removed) and requests
# go through it (the least_conn upstream with `slow_start=1s`, so added servers ramp), with one
# `nginx -s reload` in the middle. Fails unless every process's valgrind
# report says "ERROR SUMMARY: 0 errors", no [alert]/[crit]/[emerg] line was logged, and the zone's
# slab figures did not grow from after two passes over the sets (after the reload) to the end.
#
#   module/t/bench/probe-memcheck.sh [PATH/TO/libngx_http_combined_upstreams_module.so]
#
# Environment: NGINX_BIN (default /usr/sbin/nginx), SECONDS_OF_LOAD (default 40), KEEP=1 keeps
# the valgrind logs (directory printed).
set -euo pipefail
cd "$(dirname "$0")/../../.."
SO="$(readlink -f "${1:-$PWD/target/release/libngx_http_combined_upstreams_module.so}")"
NGINX="${NGINX_BIN:-/usr/sbin/nginx}"
LOAD="${SECONDS_OF_LOAD:-40}"
[ -f "$SO" ] || { echo "probe-memcheck: module not found at $SO" >&2; exit 1; }
for t in valgrind curl python3; do
  command -v "$t" >/dev/null || { echo "probe-memcheck: $t not found" >&2; exit 1; }
done

DIR="$(mktemp -d)"
PID=""; HANG=""; LOADER=""
cleanup() {
  [ -n "$LOADER" ] && kill "$LOADER" 2>/dev/null
  [ -n "$HANG" ] && kill "$HANG" 2>/dev/null
  [ -n "$PID" ] && kill -QUIT "$PID" 2>/dev/null
  wait 2>/dev/null
  [ "${KEEP:-0}" = 1 ] || rm -rf "$DIR"
}
trap cleanup EXIT
mkdir -p "$DIR/logs" "$DIR/tmp" "$DIR/conf"

free_port() {
  local p
  while :; do
    p=$((12000 + RANDOM % 20000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}
P0=$(free_port); P1=$(free_port); P2=$(free_port); P3=$(free_port); PH=$(free_port); PD=$(free_port)

# A silent backend: accepts, reads, never answers (probes time out).
python3 - "$PH" <<'PY' &
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(512)
held = []
while True:
    c, _ = s.accept(); held.append(c)
    if len(held) > 400: held.pop(0).close()
PY
HANG=$!

cat > "$DIR/conf/nginx.conf" <<CONF
load_module $SO;
daemon off; master_process on; worker_processes 2;
error_log $DIR/logs/error.log notice;
pid $DIR/logs/nginx.pid;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $DIR/tmp/body; proxy_temp_path $DIR/tmp/proxy;
  fastcgi_temp_path $DIR/tmp/fastcgi; uwsgi_temp_path $DIR/tmp/uwsgi; scgi_temp_path $DIR/tmp/scgi;
  upstream app { zone live 1m; server 127.0.0.1:$P1; server 127.0.0.1:$P2; server 127.0.0.1:$PH;
    probe uri=/healthz interval=100ms timeout=80ms fails=2 passes=2 mandatory; }
  upstream tcp { zone live; least_conn; server 127.0.0.1:$P1; server 127.0.0.1:$PD;
    probe type=tcp interval=100ms timeout=50ms slow_start=1s; }
  server { listen 127.0.0.1:$P1; location / { return 200 "b1\n"; } }
  server { listen 127.0.0.1:$P2; location /healthz { return 503; } location / { return 200 "b2\n"; } }
  server { listen 127.0.0.1:$P3; location /healthz { return 200 "ok ready\n"; } location / { return 200 "b3\n"; } }
  server {
    listen 127.0.0.1:$P0 reuseport;
    location /app { proxy_pass http://app; }
    location /tcp { proxy_pass http://tcp; }
    location /api/ { allow 127.0.0.1; deny all; upstreams_api write=on; }
  }
}
CONF

valgrind --tool=memcheck ${VALGRIND_EXTRA:-} --num-callers=40 --error-limit=no --trace-children=yes \
  --log-file="$DIR/logs/valgrind.%p.log" \
  "$NGINX" -p "$DIR" -e "$DIR/logs/error.log" -c "$DIR/conf/nginx.conf" &
PID=$!
U="http://127.0.0.1:$P0"
for _ in $(seq 600); do
  curl -s -o /dev/null "$U/api/" && break
  kill -0 "$PID" 2>/dev/null || { echo "probe-memcheck: nginx did not start"; cat "$DIR/logs/error.log"; exit 1; } >&2
  sleep 0.1
done

( while :; do for u in app tcp; do curl -s -o /dev/null -m 10 "$U/$u" || true; done; done ) &
LOADER=$!

srv() { echo "{\"address\":\"127.0.0.1:$1\"${2:-}}"; }
SETS=(
  "$(srv "$P1"),$(srv "$P2")"
  "$(srv "$P1"),$(srv "$P2"),$(srv "$P3"),$(srv "$PH")"
  "$(srv "$P3"),$(srv "$PD"),$(srv "$P1" ',"backup":true')"
  "$(srv "$P1"),$(srv "$P2" ',"weight":3'),$(srv "$PH" ',"backup":true')"
)
put() { curl -s -o /dev/null -w "%{http_code}" -X PUT "$U/api/$1" -d "{\"servers\":[$2]}"; }
retiring() { for u in app tcp; do curl -s "$U/api/$u" | python3 -c "import json,sys; print(json.load(sys.stdin)['retiring'])"; done | paste -sd+ | bc; }
# The zone's figures once no removed server is still held by a request (a request to the silent
# backend lasts until curl's 10 s limit).
slab() {
  for _ in $(seq 150); do [ "$(retiring)" = 0 ] && break; sleep 0.1; done
  curl -s "$U/api/app?slab" | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['chunks_used'], d['pages_free'])"
}
pass() { for set in "${SETS[@]}"; do for u in app tcp; do code=$(put "$u" "$set"); puts=$((puts + 1)); [ "$code" = 200 ] || { failed=$((failed + 1)); echo "PUT $u: $code" >&2; }; done; sleep 0.3; done; }
puts=0; failed=0; start=$(date +%s)
while [ $(( $(date +%s) - start )) -lt $((LOAD / 2)) ]; do pass; done
"$NGINX" -p "$DIR" -e "$DIR/logs/error.log" -c "$DIR/conf/nginx.conf" -s reload
sleep 5
pass; pass; sleep 1
first=$(slab)
while [ $(( $(date +%s) - start )) -lt "$LOAD" ]; do pass; done
sleep 1
last=$(slab)
rounds=$(curl -s "$U/api/app" | python3 -c "import json,sys; p=json.load(sys.stdin)['probe']; print(p['rounds'], p['probes'])")
kill "$LOADER" 2>/dev/null || true; wait "$LOADER" 2>/dev/null || true; LOADER=""
echo "probe-memcheck: $puts PUTs ($failed not 200), 1 reload, ${LOAD}s; after the reload: rounds/probes of app $rounds;" \
  "slab chunks_used/pages_free after 2 passes: $first, at the end: $last"
kill -QUIT "$PID"; wait "$PID" 2>/dev/null || true; PID=""
sleep 1
ok=1
for f in "$DIR"/logs/valgrind.*.log; do
  s=$(grep "ERROR SUMMARY" "$f" | tail -1 | sed 's/^==[0-9]*== //')
  echo "probe-memcheck: $(basename "$f"): ${s:-no summary (process still running?)}"
  grep -q "ERROR SUMMARY: 0 errors" <<<"$s" || ok=0
done
[ "${KEEP:-0}" = 1 ] && echo "probe-memcheck: logs in $DIR/logs"
grep -E "\[(alert|crit|emerg)\]|exited on signal" "$DIR/logs/error.log" && ok=0
# No growth: as many chunks in use or fewer; free pages at most one fewer (the record tables are
# made new before the old one is freed, so which page a size class holds can move by one).
read -r c1 p1 <<<"$first"; read -r c2 p2 <<<"$last"
{ [ "$c2" -le "$c1" ] && [ "$p2" -ge $((p1 - 1)) ]; } || { echo "probe-memcheck: slab figures grew: $first -> $last" >&2; ok=0; }
[ "$ok" = 1 ] && [ "$failed" = 0 ] || { echo "probe-memcheck: FAILED" >&2; exit 1; }
echo "probe-memcheck: OK"
