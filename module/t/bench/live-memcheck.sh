#!/usr/bin/env bash
# The live upstream API (issue 11) under valgrind memcheck: nginx with `master_process on` and 2
# workers (every process under memcheck) serves concurrent traffic through upstreams whose
# server sets are replaced by PUTs all the while — growing past 64 servers (the round-robin
# `tried` bitmap leaves its inline word), shrinking, adding and dropping backups, removing a slow
# server while requests to it are in flight (retired, then freed), on round robin, least_conn and
# keepalive upstreams — with one `nginx -s reload` in the middle. The script fails unless every
# process's valgrind report says "ERROR SUMMARY: 0 errors" and no retired server is left.
#
#   module/t/bench/live-memcheck.sh [PATH/TO/libngx_http_combined_upstreams_module.so]
#
# Environment: NGINX_BIN (default /usr/sbin/nginx), SECONDS_OF_LOAD (default 60), KEEP=1 keeps
# the valgrind logs (directory printed).
set -euo pipefail
cd "$(dirname "$0")/../../.."
SO="$(readlink -f "${1:-$PWD/target/release/libngx_http_combined_upstreams_module.so}")"
NGINX="${NGINX_BIN:-/usr/sbin/nginx}"
LOAD="${SECONDS_OF_LOAD:-60}"
[ -f "$SO" ] || { echo "live-memcheck: module not found at $SO" >&2; exit 1; }
for t in valgrind curl python3; do
  command -v "$t" >/dev/null || { echo "live-memcheck: $t not found" >&2; exit 1; }
done

DIR="$(mktemp -d)"
PID=""; SLOW=""; LOADERS=()
cleanup() {
  for p in "${LOADERS[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "$SLOW" ] && kill $SLOW 2>/dev/null
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
P0=$(free_port); P1=$(free_port); P2=$(free_port); P3=$(free_port); PS=$(free_port); PD=$(free_port)
PF=$(free_port)

# A slow backend: answers every request after 300 ms (requests in flight while it is removed).
python3 - "$PS" <<'PY' &
import http.server, socketserver, sys, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep(0.3)
        b = b"slow\n"
        self.send_response(200); self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
    def log_message(self, *a): pass
class S(socketserver.ThreadingMixIn, http.server.HTTPServer): daemon_threads = True
S(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
SLOW=$!
# A slow failing backend: reads the request, waits 300 ms, closes without an answer, so the request
# takes its next try later — often after the set changed (then it is "rebalanced").
python3 - "$PF" <<'PY' &
import socket, sys, threading, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(128)
def h(c):
    try:
        c.recv(4096); time.sleep(0.3)
    finally:
        c.close()
while True:
    c, _ = s.accept(); threading.Thread(target=h, args=(c,), daemon=True).start()
PY
SLOW="$SLOW $!"

cat > "$DIR/conf/nginx.conf" <<CONF
load_module $SO;
daemon off; master_process on; worker_processes 2;
error_log $DIR/logs/error.log warn;
pid $DIR/logs/nginx.pid;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $DIR/tmp/body; proxy_temp_path $DIR/tmp/proxy;
  fastcgi_temp_path $DIR/tmp/fastcgi; uwsgi_temp_path $DIR/tmp/uwsgi; scgi_temp_path $DIR/tmp/scgi;
  upstream rr { zone live 1m; server 127.0.0.1:$P1; }
  upstream lc { zone live; least_conn; server 127.0.0.1:$P1; }
  upstream ka { zone live; server 127.0.0.1:$P1; keepalive 8; }
  server { listen 127.0.0.1:$P1; location / { return 200 "b1\n"; } }
  server { listen 127.0.0.1:$P2; location / { return 200 "b2\n"; } }
  server { listen 127.0.0.1:$P3; location / { return 200 "b3\n"; } }
  server {
    listen 127.0.0.1:$P0 reuseport;
    access_log $DIR/logs/access.log;
    proxy_next_upstream_tries 0;
    location /rr { proxy_pass http://rr; }
    location /lc { proxy_pass http://lc; }
    location /ka { proxy_http_version 1.1; proxy_set_header Connection ""; proxy_pass http://ka; }
    location /api/ { allow 127.0.0.1; deny all; upstreams_api write=on; }
  }
}
CONF

valgrind --tool=memcheck --num-callers=40 --error-limit=no --trace-children=yes \
  --log-file="$DIR/logs/valgrind.%p.log" \
  "$NGINX" -p "$DIR" -e "$DIR/logs/error.log" -c "$DIR/conf/nginx.conf" &
PID=$!
U="http://127.0.0.1:$P0"
for _ in $(seq 600); do
  curl -s -o /dev/null "$U/api/" && break
  kill -0 "$PID" 2>/dev/null || { echo "live-memcheck: nginx did not start"; cat "$DIR/logs/error.log"; exit 1; } >&2
  sleep 0.1
done

# Traffic: 8 loops of requests to the three upstreams.
for i in 1 2 3 4 5 6 7 8; do
  ( while :; do for u in rr lc ka; do curl -s -o /dev/null -m 10 "$U/$u" || true; done; done ) &
  LOADERS+=($!)
done

srv() { echo "{\"address\":\"127.0.0.1:$1\"${2:-}}"; }
many() { # 70 dead servers (ports nothing listens on) and b1
  local s="" i
  for i in $(seq 1 70); do s="$s{\"address\":\"127.0.0.$((i + 1)):$PD\"},"; done
  echo "$s$(srv "$P1")"
}
SETS=(
  "$(srv "$P1"),$(srv "$P2")"
  "$(srv "$P1"),$(srv "$P2"),$(srv "$P3" ',"backup":true')"
  "$(srv "$PS"),$(srv "$P2")"
  "$(many)"
  "$(srv "$P3"),$(srv "$PD" ',"backup":true'),$(srv "$P1" ',"backup":true')"
  "$(srv "$P2"),$(srv "$PS" ',"weight":3')"
  "$(srv "$PF" ',"max_fails":0'),$(srv "$P3"),$(srv "$P2" ',"backup":true')"
)
# (The failing backend is in the last set only: a request it fails is rebalanced into the first
# set, where every server answers; so every request must end in 2xx.)
put() { curl -s -o /dev/null -w "%{http_code}" -X PUT "$U/api/$1" -d "{\"servers\":[$2]}"; }
puts=0; failed=0; start=$(date +%s); reloaded=0
while [ $(( $(date +%s) - start )) -lt "$LOAD" ]; do
  for set in "${SETS[@]}"; do
    for u in rr lc ka; do
      code=$(put "$u" "$set"); puts=$((puts + 1))
      [ "$code" = 200 ] || { failed=$((failed + 1)); echo "PUT $u: $code" >&2; }
    done
    sleep 0.2
  done
  if [ "$reloaded" = 0 ] && [ $(( $(date +%s) - start )) -ge $((LOAD / 2)) ]; then
    "$NGINX" -p "$DIR" -e "$DIR/logs/error.log" -c "$DIR/conf/nginx.conf" -s reload; reloaded=1
  fi
done
for p in "${LOADERS[@]}"; do kill "$p" 2>/dev/null || true; done
wait "${LOADERS[@]}" 2>/dev/null || true
LOADERS=()
# Let in-flight requests end, then no retired server may be left.
for u in rr lc ka; do put "$u" "$(srv "$P1")" >/dev/null; done
sleep 1
field() { for u in rr lc ka; do curl -s "$U/api/$u" | python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; done | paste -sd+ | bc; }
retiring=$(field retiring); rebalanced=$(field rebalanced)
requests=$(grep -c ' "GET /\(rr\|lc\|ka\)' "$DIR/logs/access.log" || true)
not2xx=$(grep ' "GET /\(rr\|lc\|ka\)' "$DIR/logs/access.log" | awk '$9 !~ /^2/' | wc -l)
echo "live-memcheck: $requests proxied requests ($not2xx not 2xx), $puts PUTs ($failed not 200), 1 reload, ${LOAD}s;" \
  "requests rebalanced (counted since the reload): $rebalanced; retired servers left: $retiring"
kill -QUIT "$PID"; wait "$PID" 2>/dev/null || true; PID=""
sleep 1
ok=1
for f in "$DIR"/logs/valgrind.*.log; do
  s=$(grep "ERROR SUMMARY" "$f" | tail -1 | sed 's/^==[0-9]*== //')
  echo "live-memcheck: $(basename "$f"): ${s:-no summary (process still running?)}"
  grep -q "ERROR SUMMARY: 0 errors" <<<"$s" || ok=0
done
[ "${KEEP:-0}" = 1 ] && echo "live-memcheck: logs in $DIR/logs"
grep -E "\[(alert|crit|emerg)\]|exited on signal" "$DIR/logs/error.log" && ok=0
[ "$ok" = 1 ] && [ "$failed" = 0 ] && [ "$retiring" = 0 ] && [ "$not2xx" = 0 ] || { echo "live-memcheck: FAILED" >&2; exit 1; }
echo "live-memcheck: OK"
